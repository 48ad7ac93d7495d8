//! `exec:` kernels: any process that speaks the worker protocol (JSON lines on
//! stdin/stdout; tensors in a shared-memory region (version 2) or safetensors files
//! (version 1); `kernels/external/PROTOCOL.md`).
//!
//! This is how the real libraries are fuzzed: a small adapter in `kernels/external/`
//! imports DeepGEMM, AITER, vLLM or torch and answers requests, and the campaign sees an
//! ordinary [`Kernel`](crate::kernel::Kernel). The same protocol isolates built-in
//! kernels (`mqa-fuzz worker --kernel NAME`), so a device fault costs one case.
//!
//! - [`protocol`]: messages, versions, and the tensors of a case (files for version 1).
//! - [`shm`]: version 2's shared-memory region; `wire`: what of a case travels, in what
//!   types and layout.
//! - `process`: starting, reading and killing a worker process or a fork-server life.
//! - [`client`]: [`ExecKernel`], the supervised worker pool; `config`: how it starts its
//!   workers ([`ExecConfig`]).
//! - [`server`]: the worker side for built-in kernels.
//! - [`aliases`]: `numpy`, `torch`, `deepgemm`, `aiter`, `vllm` → adapter command lines.

pub mod aliases;
pub mod client;
mod config;
mod process;
pub mod protocol;
mod safetensors_stream;
pub mod server;
pub mod shm;
mod wire;

pub use client::{device_env, ExecConfig, ExecKernel};
pub use protocol::{Hello, PROTOCOL_VERSION};

use super::{Kernel, KernelEntry, OpenError, RunError};

/// Registry entries: the generic `exec:` form and the adapter aliases.
pub fn entries() -> Vec<KernelEntry> {
    let mut v = vec![KernelEntry {
        name: "exec:<command>".into(),
        description: "any process speaking the worker protocol (kernels/external/PROTOCOL.md); MQA_FUZZ_EXEC_DEVICES=0,1,.. for one worker per GPU".into(),
        available: Ok(()),
        planted_bug: false,
    }];
    v.extend(aliases::entries());
    v
}

/// Opens `exec:<command>` or an alias (`deepgemm`, `numpy --plant tail-unwritten`, ...);
/// `None` when the name is neither.
pub fn open(name: &str) -> Option<Result<Box<dyn Kernel>, OpenError>> {
    let command = if let Some(cmd) = name.strip_prefix("exec:") {
        if cmd.trim().is_empty() {
            return Some(Err(OpenError::Invalid {
                name: name.into(),
                reason: "exec: needs a command, e.g. exec:python3 my_adapter.py".into(),
            }));
        }
        cmd.to_string()
    } else {
        match aliases::expand(name)? {
            Ok(cmd) => cmd,
            Err(e) => return Some(Err(e)),
        }
    };
    Some(open_command(name, &command))
}

/// Starts an [`ExecKernel`] for `command` with settings from the environment.
pub fn open_command(name: &str, command: &str) -> Result<Box<dyn Kernel>, OpenError> {
    let config = ExecConfig::from_env(command).map_err(|reason| OpenError::Invalid {
        name: name.into(),
        reason,
    })?;
    match ExecKernel::start(name, config) {
        Ok(k) => Ok(Box::new(k)),
        Err(
            RunError::Crash(reason) | RunError::Environment(reason) | RunError::Skipped(reason),
        ) => Err(OpenError::Unavailable {
            name: name.into(),
            reason,
        }),
    }
}
