//! The KV cache as a device would see it: one flat allocation of `num_blocks *
//! kv_block_stride` bytes where only referenced blocks hold data and every other byte
//! is poison (fp8 NaN codes, NaN scales). CPU kernels that model address bugs read
//! through this view, so a wrong address yields NaN exactly as on the GPU, where the
//! CUDA backend poisons unreferenced memory the same way ([`poison_byte`]).

use crate::case::Case;
use crate::fp8::Fp8Format;

/// The poison byte at `offset` inside a block slot of the device cache: NaN codes in
/// the value area and the stride padding, NaN (0x7FC00000, little-endian) in scales.
pub fn poison_byte(case: &Case, offset_in_block: u64) -> u8 {
    let s = &case.shape;
    let values = (s.block_size * s.head_dim) as u64;
    let scales_end = values + 4 * s.block_size as u64;
    if offset_in_block >= values && offset_in_block < scales_end {
        [0x00, 0x00, 0xC0, 0x7F][((offset_in_block - values) % 4) as usize]
    } else {
        match s.format {
            Fp8Format::E4m3fn => 0x7F,
            Fp8Format::E4m3fnuz => 0x80,
        }
    }
}

pub struct DeviceView<'a> {
    case: &'a Case,
}

impl<'a> DeviceView<'a> {
    pub fn new(case: &'a Case) -> Self {
        DeviceView { case }
    }

    /// Size of the allocation in bytes.
    pub fn len(&self) -> u64 {
        self.case.kv_cache_bytes()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The byte at `offset`, or `None` outside the allocation (an illegal address on
    /// NVIDIA; a buffer load that returns 0 on AMD).
    pub fn byte(&self, offset: i64) -> Option<u8> {
        if offset < 0 || offset as u64 >= self.len() {
            return None;
        }
        let off = offset as u64;
        let stride = self.case.kv_block_stride;
        let (id, within) = (off / stride, off % stride);
        match self.case.kv.get(id) {
            Some(b) if (within as usize) < b.len() => Some(b[within as usize]),
            _ => Some(poison_byte(self.case, within)),
        }
    }

    pub fn f32_le(&self, offset: i64) -> Option<f32> {
        let mut b = [0u8; 4];
        for (k, x) in b.iter_mut().enumerate() {
            *x = self.byte(offset + k as i64)?;
        }
        Some(f32::from_le_bytes(b))
    }
}
