//! Streaming safetensors I/O for the worker protocol.
//!
//! The `safetensors` crate serializes from and deserializes into whole in-memory
//! blobs. A case whose output passes 2 GiB (the output-offset axis) would then need
//! two or three extra copies of that buffer; here tensors are written straight from
//! their slices and read straight into the destination, with every size checked
//! against the file before anything is allocated from it.

use serde::Deserialize;
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Read, Seek, SeekFrom, Write};
use std::path::Path;

/// Largest header we accept (the format's own limit is 100 MB).
const MAX_HEADER: u64 = 100 << 20;
/// Bytes converted per step when streaming f32 data.
const CHUNK: usize = 1 << 16;

/// Element types the protocol uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
pub enum Dtype {
    U8,
    I32,
    I64,
    F32,
}

impl Dtype {
    pub fn size(self) -> usize {
        match self {
            Dtype::U8 => 1,
            Dtype::I32 | Dtype::F32 => 4,
            Dtype::I64 => 8,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Dtype::U8 => "U8",
            Dtype::I32 => "I32",
            Dtype::I64 => "I64",
            Dtype::F32 => "F32",
        }
    }
}

/// The data of one tensor to write.
pub enum Data<'a> {
    Bytes(&'a [u8]),
    /// U8 data in pieces (the sparse cache's blocks), written back to back.
    Pieces(Vec<&'a [u8]>),
    I32(&'a [i32]),
    I64(&'a [i64]),
    F32(&'a [f32]),
}

impl Data<'_> {
    pub fn dtype(&self) -> Dtype {
        match self {
            Data::Bytes(_) | Data::Pieces(_) => Dtype::U8,
            Data::I32(_) => Dtype::I32,
            Data::I64(_) => Dtype::I64,
            Data::F32(_) => Dtype::F32,
        }
    }
    pub fn byte_len(&self) -> usize {
        match self {
            Data::Bytes(b) => b.len(),
            Data::Pieces(p) => p.iter().map(|b| b.len()).sum(),
            Data::I32(v) => 4 * v.len(),
            Data::I64(v) => 8 * v.len(),
            Data::F32(v) => 4 * v.len(),
        }
    }

    /// Copies the little-endian bytes into `dst` (exactly `byte_len` long).
    pub fn copy_to(&self, dst: &mut [u8]) {
        fn par_le<T: Copy + Sync, const N: usize>(
            dst: &mut [u8],
            v: &[T],
            f: impl Fn(T) -> [u8; N] + Sync,
        ) {
            use rayon::prelude::*;
            dst.par_chunks_mut(N << 20)
                .zip(v.par_chunks(1 << 20))
                .for_each(|(d, s)| {
                    for (d, &x) in d.chunks_exact_mut(N).zip(s) {
                        d.copy_from_slice(&f(x));
                    }
                });
        }
        match self {
            Data::Bytes(b) => dst.copy_from_slice(b),
            Data::Pieces(p) => {
                let mut at = 0;
                for b in p {
                    dst[at..at + b.len()].copy_from_slice(b);
                    at += b.len();
                }
            }
            // The output buffer can pass 2 GiB and an engine's block table 100 MB:
            // copied on every core, 1 Mi elements a task.
            Data::I32(v) => par_le(dst, v, i32::to_le_bytes),
            Data::I64(v) => par_le(dst, v, i64::to_le_bytes),
            Data::F32(v) => par_le(dst, v, f32::to_le_bytes),
        }
    }
}

/// Writes `tensors` (name, shape, data) to `path` as one safetensors file.
pub fn write(path: &Path, tensors: &[(&str, Vec<usize>, Data)]) -> std::io::Result<()> {
    let mut header = serde_json::Map::new();
    let mut offset = 0usize;
    for (name, shape, data) in tensors {
        let n: usize = shape.iter().product();
        if n * data.dtype().size() != data.byte_len() {
            return Err(std::io::Error::other(format!(
                "tensor {name}: shape {shape:?} does not match {} bytes",
                data.byte_len()
            )));
        }
        let end = offset + data.byte_len();
        header.insert(
            name.to_string(),
            serde_json::json!({"dtype": data.dtype().name(), "shape": shape, "data_offsets": [offset, end]}),
        );
        offset = end;
    }
    let mut text =
        serde_json::to_vec(&serde_json::Value::Object(header)).map_err(std::io::Error::other)?;
    // Pad with spaces so the data starts 8-byte aligned (what the reference writer does).
    while (text.len() + 8) % 8 != 0 {
        text.push(b' ');
    }
    let mut w = BufWriter::with_capacity(1 << 20, File::create(path)?);
    w.write_all(&(text.len() as u64).to_le_bytes())?;
    w.write_all(&text)?;
    let mut buf = Vec::with_capacity(CHUNK * 8);
    for (_, _, data) in tensors {
        match data {
            Data::Bytes(b) => w.write_all(b)?,
            Data::Pieces(p) => {
                for b in p {
                    w.write_all(b)?;
                }
            }
            Data::I32(v) => write_chunked(&mut w, &mut buf, v, |x| x.to_le_bytes())?,
            Data::I64(v) => write_chunked(&mut w, &mut buf, v, |x| x.to_le_bytes())?,
            Data::F32(v) => write_chunked(&mut w, &mut buf, v, |x| x.to_le_bytes())?,
        }
    }
    w.flush()
}

fn write_chunked<T: Copy, const N: usize>(
    w: &mut impl Write,
    buf: &mut Vec<u8>,
    v: &[T],
    le: impl Fn(T) -> [u8; N],
) -> std::io::Result<()> {
    for chunk in v.chunks(CHUNK) {
        buf.clear();
        buf.extend(chunk.iter().flat_map(|&x| le(x)));
        w.write_all(buf)?;
    }
    Ok(())
}

/// One tensor of a file being read.
#[derive(Clone, Debug, Deserialize)]
pub struct TensorInfo {
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    pub data_offsets: (u64, u64),
}

/// An open safetensors file: its header, checked against the file size.
#[derive(Debug)]
pub struct Reader {
    file: File,
    data_start: u64,
    pub tensors: BTreeMap<String, TensorInfo>,
}

impl Reader {
    pub fn open(path: &Path) -> Result<Reader, String> {
        let mut file = File::open(path).map_err(|e| e.to_string())?;
        let len = file.metadata().map_err(|e| e.to_string())?.len();
        let mut n = [0u8; 8];
        file.read_exact(&mut n)
            .map_err(|_| "file is shorter than the 8-byte header length".to_string())?;
        let n = u64::from_le_bytes(n);
        if n > MAX_HEADER || 8 + n > len {
            return Err(format!(
                "header length {n} does not fit the {len}-byte file"
            ));
        }
        let mut text = vec![0u8; n as usize];
        file.read_exact(&mut text).map_err(|e| e.to_string())?;
        let raw: BTreeMap<String, serde_json::Value> = serde_json::from_slice(&text)
            .map_err(|e| format!("header is not a JSON object: {e}"))?;
        let mut tensors = BTreeMap::new();
        let data_len = len - 8 - n;
        for (name, v) in raw {
            if name == "__metadata__" {
                continue;
            }
            let info: TensorInfo =
                serde_json::from_value(v).map_err(|e| format!("tensor {name}: {e}"))?;
            let count = info
                .shape
                .iter()
                .try_fold(1u64, |a, &d| a.checked_mul(d as u64));
            let want = count.and_then(|c| c.checked_mul(info.dtype.size() as u64));
            let (b, e) = info.data_offsets;
            if e < b || e > data_len || Some(e - b) != want {
                return Err(format!(
                    "tensor {name}: offsets {b}..{e} do not match shape {:?} of {} in {data_len} data bytes",
                    info.shape,
                    info.dtype.name()
                ));
            }
            tensors.insert(name, info);
        }
        Ok(Reader {
            file,
            data_start: 8 + n,
            tensors,
        })
    }

    /// The tensor's info, checked for dtype.
    pub fn info(&self, name: &str, dtype: Dtype) -> Result<&TensorInfo, String> {
        let t = self
            .tensors
            .get(name)
            .ok_or_else(|| format!("tensor {name} is missing"))?;
        if t.dtype != dtype {
            return Err(format!(
                "tensor {name} is {}, expected {}",
                t.dtype.name(),
                dtype.name()
            ));
        }
        Ok(t)
    }

    fn seek_to(&mut self, name: &str, dtype: Dtype) -> Result<(Vec<usize>, u64), String> {
        let t = self.info(name, dtype)?.clone();
        self.file
            .seek(SeekFrom::Start(self.data_start + t.data_offsets.0))
            .map_err(|e| e.to_string())?;
        Ok((t.shape, t.data_offsets.1 - t.data_offsets.0))
    }

    pub fn bytes(&mut self, name: &str) -> Result<(Vec<usize>, Vec<u8>), String> {
        let (shape, n) = self.seek_to(name, Dtype::U8)?;
        let mut v = vec![0u8; n as usize];
        self.file
            .read_exact(&mut v)
            .map_err(|e| format!("tensor {name}: {e}"))?;
        Ok((shape, v))
    }

    pub fn i32s(&mut self, name: &str) -> Result<(Vec<usize>, Vec<i32>), String> {
        let (shape, n) = self.seek_to(name, Dtype::I32)?;
        let mut v = vec![0i32; n as usize / 4];
        self.read_chunked(name, &mut v, i32::from_le_bytes)?;
        Ok((shape, v))
    }

    pub fn i64s(&mut self, name: &str) -> Result<(Vec<usize>, Vec<i64>), String> {
        let (shape, n) = self.seek_to(name, Dtype::I64)?;
        let mut v = vec![0i64; n as usize / 8];
        self.read_chunked(name, &mut v, i64::from_le_bytes)?;
        Ok((shape, v))
    }

    pub fn f32s(&mut self, name: &str) -> Result<(Vec<usize>, Vec<f32>), String> {
        let (shape, n) = self.seek_to(name, Dtype::F32)?;
        let mut v = vec![0f32; n as usize / 4];
        self.read_chunked(name, &mut v, f32::from_le_bytes)?;
        Ok((shape, v))
    }

    /// Reads an f32 tensor of exactly `dst.len()` elements into `dst`.
    pub fn f32s_into(&mut self, name: &str, dst: &mut [f32]) -> Result<Vec<usize>, String> {
        let (shape, n) = self.seek_to(name, Dtype::F32)?;
        if n != 4 * dst.len() as u64 {
            return Err(format!(
                "tensor {name} has {} elements, expected {}",
                n / 4,
                dst.len()
            ));
        }
        self.read_chunked(name, dst, f32::from_le_bytes)?;
        Ok(shape)
    }

    fn read_chunked<T, const N: usize>(
        &mut self,
        name: &str,
        dst: &mut [T],
        from_le: impl Fn([u8; N]) -> T,
    ) -> Result<(), String> {
        let mut buf = vec![0u8; CHUNK * N];
        for part in dst.chunks_mut(CHUNK) {
            let bytes = &mut buf[..part.len() * N];
            self.file
                .read_exact(bytes)
                .map_err(|e| format!("tensor {name}: {e}"))?;
            for (x, c) in part.iter_mut().zip(bytes.chunks_exact(N)) {
                *x = from_le(c.try_into().unwrap());
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_crate_compatibility() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.safetensors");
        let q = [1u8, 2, 3];
        let w = [1.5f32, f32::from_bits(0x7FC0_FFEE)];
        let ids = [7i64, -1];
        let t = [3i32, -4, 5, 6];
        write(
            &p,
            &[
                ("q", vec![3], Data::Bytes(&q)),
                ("w", vec![2], Data::F32(&w)),
                ("ids", vec![2], Data::I64(&ids)),
                ("t", vec![2, 2], Data::I32(&t)),
            ],
        )
        .unwrap();
        // The reference implementation reads what we write.
        let bytes = std::fs::read(&p).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        assert_eq!(st.tensor("t").unwrap().shape(), &[2, 2]);
        let mut r = Reader::open(&p).unwrap();
        assert_eq!(r.bytes("q").unwrap().1, q);
        assert_eq!(r.f32s("w").unwrap().1[1].to_bits(), 0x7FC0_FFEE);
        assert_eq!(r.i64s("ids").unwrap().1, ids);
        assert_eq!(r.i32s("t").unwrap(), (vec![2, 2], t.to_vec()));
        assert!(r.f32s("q").unwrap_err().contains("expected F32"));
        assert!(r.bytes("nope").unwrap_err().contains("missing"));
    }

    #[test]
    fn truncated_file_is_an_error_not_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.safetensors");
        write(&p, &[("w", vec![4], Data::F32(&[1.0; 4]))]).unwrap();
        let bytes = std::fs::read(&p).unwrap();
        std::fs::write(&p, &bytes[..bytes.len() - 3]).unwrap();
        assert!(Reader::open(&p).unwrap_err().contains("do not match"));
        std::fs::write(&p, b"xx").unwrap();
        assert!(Reader::open(&p).is_err());
    }
}
