//! A library kernel launched by the process that hosts this crate as a shared library.
//!
//! A Python adapter (`kernels/external/hosted.py`) loads `libmqa_fuzz.so` into the
//! process where torch and the library live, and hands [`crate::hosted`]'s entry point
//! a launch callback. This crate then serves the worker protocol as `cuda:` workers do:
//! it lays each case out on the device (its keys drawn there, the cache and output
//! poisoned and kept between cases, [`super::memory`]), checks the inputs, judges on
//! the device. Only the launch is the host's: the callback gets a [`HostedCall`] with
//! the device pointers and shape, wraps them as tensors (no copy: one process, one
//! primary context, the legacy default stream on both sides) and calls the library.
//!
//! The C layout of [`HostedCall`] is mirrored in `hosted.py`; [`ABI`] changes with it.

use super::memory::Params;

/// The version of [`HostedCall`]'s layout and of the entry points' signatures.
pub const ABI: u32 = 1;

/// What the callback returns.
pub mod status {
    /// The kernel ran; `kernel_us` holds its own time (or a negative number).
    pub const OK: i32 = 0;
    /// The library declines this case (an input it documents it cannot take).
    pub const SKIPPED: i32 = 1;
    /// The host cannot run the library at all (missing, wrong device).
    pub const ENVIRONMENT: i32 = 2;
    /// The library raised an error: this case's crash.
    pub const RAISED: i32 = 3;
}

/// One launch, as the callback sees it. Mirrored field for field in `hosted.py`.
#[repr(C)]
pub struct HostedCall {
    /// The case on the device: pointers and shape (`kernels/common.cuh`'s `Params`).
    pub params: Params,
    /// Blocks of the cache (`params.kv_bytes / params.kv_stride`).
    pub num_blocks: u64,
    /// Rows of the output (`batch * next_n`).
    pub rows: u64,
    /// Set by the callback: the kernel's own time in microseconds (negative: unknown).
    pub kernel_us: f64,
    /// Set by the callback on an error: a NUL-terminated UTF-8 message.
    pub message: [u8; 2048],
}

impl HostedCall {
    pub fn new(params: Params, num_blocks: u64, rows: u64) -> HostedCall {
        HostedCall {
            params,
            num_blocks,
            rows,
            kernel_us: -1.0,
            message: [0; 2048],
        }
    }

    /// The callback's message (up to its first NUL).
    pub fn message(&self) -> String {
        let end = self
            .message
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(self.message.len());
        String::from_utf8_lossy(&self.message[..end]).into_owned()
    }
}

/// The host's launch callback.
pub type LaunchFn = unsafe extern "C" fn(call: *mut HostedCall) -> i32;

/// The callback, as an address (so [`super::Variant`] stays comparable without
/// comparing function pointers).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct HostedLaunch(usize);

impl HostedLaunch {
    pub fn new(f: LaunchFn) -> HostedLaunch {
        HostedLaunch(f as usize)
    }

    /// Calls the host.
    ///
    /// # Safety
    /// The address came from a [`LaunchFn`] that stays valid while the server runs (the
    /// host keeps its callback object alive for the whole call of the entry point).
    pub unsafe fn call(self, call: &mut HostedCall) -> i32 {
        let f: LaunchFn = std::mem::transmute::<usize, LaunchFn>(self.0);
        f(call)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    unsafe extern "C" fn writes_back(call: *mut HostedCall) -> i32 {
        let c = &mut *call;
        c.kernel_us = (c.params.batch as u64 * c.rows + c.num_blocks) as f64;
        let msg = b"declined: too odd\0";
        c.message[..msg.len()].copy_from_slice(msg);
        status::SKIPPED
    }

    #[test]
    fn a_callback_sees_the_call_and_answers_through_it() {
        let params = Params {
            batch: 3,
            ..Params::default()
        };
        let mut call = HostedCall::new(params, 7, 5);
        let h = HostedLaunch::new(writes_back);
        assert_eq!(unsafe { h.call(&mut call) }, status::SKIPPED);
        assert_eq!(call.kernel_us, 22.0);
        assert_eq!(call.message(), "declined: too odd");
    }

    /// `hosted.py` mirrors this layout with ctypes; its offsets are checked against
    /// these numbers by `tests/exec_hosted.rs`.
    #[test]
    fn the_layout_is_what_the_host_mirrors() {
        assert_eq!(std::mem::size_of::<Params>(), 10 * 8 + 12 * 4);
        assert_eq!(std::mem::offset_of!(HostedCall, num_blocks), 128);
        assert_eq!(std::mem::offset_of!(HostedCall, kernel_us), 144);
        assert_eq!(std::mem::offset_of!(HostedCall, message), 152);
        assert_eq!(std::mem::size_of::<HostedCall>(), 152 + 2048);
    }
}
