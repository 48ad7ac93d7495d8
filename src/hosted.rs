//! The entry points of `libmqa_fuzz.so`, for a process that hosts a library's kernel.
//!
//! A Python adapter (`kernels/external/hosted.py`) that has imported torch and the
//! library loads this crate as a shared library and calls [`mqa_fuzz_hosted_serve`]
//! with its worker pipes, its hello and a launch callback. From there the worker
//! protocol is served by the same loop as `mqa-fuzz worker --kernel cuda-direct:…`
//! ([`crate::kernel::exec::server::serve_on`]): each case is laid out, poisoned, checked
//! and judged on the device by this crate, and only the launch is the host's
//! ([`crate::kernel::cuda::hosted`]). The harness sees an ordinary worker whose hello
//! says it draws values and judges on its device.

use crate::kernel::cuda::hosted::{HostedLaunch, LaunchFn, ABI};
use crate::kernel::cuda::kernels::CudaDirect;
use crate::kernel::exec::protocol::{self, ErrorKind, Hello, WorkerLine};
use crate::kernel::exec::server::{serve_on, Fault};
use crate::kernel::Kernel;
use std::ffi::{c_char, c_int, CStr};
use std::fs::File;
use std::io::Write;
use std::os::fd::FromRawFd;

/// The layout version of the call the callback receives; the host refuses to serve
/// through a library whose number differs from its own.
#[no_mangle]
pub extern "C" fn mqa_fuzz_hosted_abi() -> u32 {
    ABI
}

/// Serves the worker protocol on `in_fd`/`out_fd` (duplicated; the host keeps its
/// own) with the kernel `launch` runs, described by `hello` (a JSON object with the
/// hello fields of `kernels/external/PROTOCOL.md`: name, library, version, device,
/// capabilities, compile_key). `fault` (may be null): a `--fault` spec of `mqa-fuzz
/// worker`. Returns the worker's exit status: 0 when the requests ended, 70 after a
/// device fault, 3 when the device or the hello is unusable (said on `out_fd` first).
///
/// # Safety
/// `hello` and `fault` are NUL-terminated strings (or `fault` null); `launch` stays
/// callable until this returns; the file descriptors are open.
#[no_mangle]
pub unsafe extern "C" fn mqa_fuzz_hosted_serve(
    in_fd: c_int,
    out_fd: c_int,
    hello: *const c_char,
    fault: *const c_char,
    launch: Option<LaunchFn>,
) -> c_int {
    let ran = std::panic::catch_unwind(|| {
        let hello = if hello.is_null() {
            String::new()
        } else {
            CStr::from_ptr(hello).to_string_lossy().into_owned()
        };
        let fault = (!fault.is_null())
            .then(|| CStr::from_ptr(fault).to_string_lossy().into_owned())
            .filter(|f| !f.is_empty());
        let (input, mut out) = match (dup(in_fd), dup(out_fd)) {
            (Ok(i), Ok(o)) => (i, o),
            (Err(e), _) | (_, Err(e)) => {
                eprintln!("mqa-fuzz hosted: cannot use the worker's pipes: {e}");
                return crate::error::exit::ENVIRONMENT;
            }
        };
        match serve(&hello, fault.as_deref(), launch, input, &mut out) {
            Ok(code) => code,
            Err(message) => {
                let line = WorkerLine::Error {
                    id: None,
                    kind: ErrorKind::Environment,
                    message: message.clone(),
                };
                let _ = out.write_all(line.to_line().as_bytes());
                eprintln!("mqa-fuzz hosted: {message}");
                crate::error::exit::ENVIRONMENT
            }
        }
    });
    ran.unwrap_or_else(|_| {
        eprintln!("mqa-fuzz hosted: the server panicked");
        crate::kernel::exec::server::FAULTED_STATUS
    })
}

fn dup(fd: c_int) -> std::io::Result<File> {
    // SAFETY: dup(2) on a descriptor the host owns; the copy is ours to close.
    let d = unsafe { libc::dup(fd) };
    if d < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `d` is a fresh descriptor no one else owns.
    Ok(unsafe { File::from_raw_fd(d) })
}

/// The hello a hosted worker sends: the host's description, with what this crate
/// adds (the protocol both sides speak, drawn values, the device judge).
pub fn hosted_hello(host: &str) -> Result<Hello, String> {
    let mut v: serde_json::Value =
        serde_json::from_str(host).map_err(|e| format!("the host's hello is not JSON: {e}"))?;
    let obj = v
        .as_object_mut()
        .ok_or("the host's hello is not a JSON object")?;
    obj.remove("type");
    obj.insert(
        "protocol".into(),
        protocol::chosen_protocol(std::env::var("MQA_FUZZ_PROTOCOLS").ok().as_deref()).into(),
    );
    obj.insert("draws_values".into(), true.into());
    obj.insert("draws_table_tails".into(), true.into());
    obj.insert("judges_on_device".into(), true.into());
    serde_path_to_error::deserialize(v)
        .map_err(|e| format!("the host's hello: field `{}`: {}", e.path(), e.inner()))
}

fn serve(
    host_hello: &str,
    fault: Option<&str>,
    launch: Option<LaunchFn>,
    input: File,
    out: &mut File,
) -> Result<i32, String> {
    let launch = launch.ok_or("the host passed no launch callback")?;
    let hello = hosted_hello(host_hello)?;
    let fault = fault.map(Fault::parse).transpose()?;
    crate::kernel::cuda::device::availability()?;
    let kernel = CudaDirect::hosted(
        hello.name.clone(),
        hello.version.clone(),
        hello.capabilities.clone(),
        hello.compile_key.clone(),
        HostedLaunch::new(launch),
    );
    debug_assert_eq!(kernel.name(), hello.name);
    serve_on(&kernel, hello, Box::new(input), out, fault).map_err(|f| f.message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hello_takes_the_hosts_description_and_adds_ours() {
        let caps = serde_json::to_value(crate::kernel::Capabilities::everything(
            crate::ScalePlacement::AfterReluSum,
        ))
        .unwrap();
        let host = serde_json::json!({
            "type": "hello", "name": "deepgemm:fp8_fp4_paged_mqa_logits", "library": "deep_gemm",
            "version": "2.8.2", "device": "NVIDIA H200 (sm90)", "capabilities": caps,
            "compile_key": ["heads", "head_dim", "next_n"],
        });
        let h = hosted_hello(&host.to_string()).unwrap();
        assert_eq!(h.name, "deepgemm:fp8_fp4_paged_mqa_logits");
        assert_eq!(h.compile_key.len(), 3);
        assert!(h.draws_values && h.draws_table_tails && h.judges_on_device);
        let bad = serde_json::json!({"name": "x", "library": "y", "version": "1", "device": "d", "capabilities": {"formats": 3}});
        let e = hosted_hello(&bad.to_string()).unwrap_err();
        assert!(e.contains("capabilities"), "{e}");
        assert!(hosted_hello("[1]")
            .unwrap_err()
            .contains("not a JSON object"));
    }

    #[test]
    fn the_abi_is_the_calls_layout_version() {
        assert_eq!(mqa_fuzz_hosted_abi(), ABI);
    }
}
