//! Run-time compilation of the kernels in `kernels/` with NVRTC, cached on disk.
//!
//! The `.cu` sources are embedded in the binary (`include_str!`) so it is
//! self-contained. A variant is compiled at first use for the device's architecture
//! (`sm_90a` on Hopper, so `mma`/`wgmma` forms of the chip are available) and the
//! cubin is cached under `$XDG_CACHE_HOME/mqa-fuzz` (or `~/.cache/mqa-fuzz`), keyed
//! by a hash of the source, the architecture and the defines: a worker process that
//! restarts after a crash loads the cubin in milliseconds instead of recompiling.

use super::sys;
use std::path::PathBuf;

/// Text prepended to every kernel (the `Params` struct and shared helpers).
const COMMON: &str = include_str!("../../../kernels/common.cuh");

/// One `.cu` file of `kernels/`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Program {
    Util,
    Naive,
    Tiled,
    Reference,
    Generate,
    Judge,
}

impl Program {
    pub const ALL: [Program; 6] = [
        Program::Util,
        Program::Naive,
        Program::Tiled,
        Program::Reference,
        Program::Generate,
        Program::Judge,
    ];

    pub fn file(self) -> &'static str {
        match self {
            Program::Util => "util.cu",
            Program::Naive => "naive.cu",
            Program::Tiled => "tiled.cu",
            Program::Reference => "reference.cu",
            Program::Generate => "generate.cu",
            Program::Judge => "judge.cu",
        }
    }

    pub(super) fn source(self) -> &'static str {
        match self {
            Program::Util => include_str!("../../../kernels/util.cu"),
            Program::Naive => include_str!("../../../kernels/naive.cu"),
            Program::Tiled => include_str!("../../../kernels/tiled.cu"),
            Program::Reference => include_str!("../../../kernels/reference.cu"),
            Program::Generate => include_str!("../../../kernels/generate.cu"),
            Program::Judge => include_str!("../../../kernels/judge.cu"),
        }
    }
}

/// `#define NAME VALUE` pairs of a variant, in a fixed order.
pub type Defines = Vec<(String, String)>;

fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for &b in *p {
            h ^= b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        h ^= 0xff;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Where compiled cubins are kept.
pub fn cache_dir() -> Option<PathBuf> {
    if let Some(x) = std::env::var_os("XDG_CACHE_HOME").filter(|x| !x.is_empty()) {
        return Some(PathBuf::from(x).join("mqa-fuzz"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache").join("mqa-fuzz"))
}

/// The CUDA include directory NVRTC gets (`CUDA_HOME`, `CUDA_PATH`, `/usr/local/cuda`).
/// Our kernels include nothing, but headers are passed so edits may.
fn include_dir() -> Option<String> {
    let roots = [
        std::env::var("CUDA_HOME").ok(),
        std::env::var("CUDA_PATH").ok(),
        Some("/usr/local/cuda".into()),
    ];
    roots
        .into_iter()
        .flatten()
        .map(|r| format!("{r}/include"))
        .find(|p| std::path::Path::new(p).is_dir())
}

/// Where the cubin of `program` with `defines` for `arch` is kept: named by a hash of
/// the sources, the architecture and the defines, so an edited kernel is compiled anew.
fn cache_file(program: Program, arch: &str, defines: &Defines) -> Option<PathBuf> {
    let def_text: String = defines.iter().map(|(k, v)| format!("{k}={v};")).collect();
    let key = fnv1a(&[
        COMMON.as_bytes(),
        program.source().as_bytes(),
        arch.as_bytes(),
        def_text.as_bytes(),
    ]);
    let stem = program.file().trim_end_matches(".cu");
    cache_dir().map(|d| d.join(format!("{stem}-{arch}-{key:016x}.cubin")))
}

/// The cubin from the disk cache only (`None` when it was never compiled here): what a
/// worker's warm-up loads, since compiling a variant no case may need is not a warm-up.
pub fn cached_cubin(program: Program, arch: &str, defines: &Defines) -> Option<Vec<u8>> {
    let bytes = std::fs::read(cache_file(program, arch, defines)?).ok()?;
    (!bytes.is_empty()).then_some(bytes)
}

/// The cubin of `program` with `defines` for `arch` (e.g. `sm_90a`): from the disk
/// cache, or compiled now. `Err` holds NVRTC's log (an environment error).
pub fn cubin(program: Program, arch: &str, defines: &Defines) -> Result<Vec<u8>, String> {
    if let Some(bytes) = cached_cubin(program, arch, defines) {
        return Ok(bytes);
    }
    let def_text: String = defines.iter().map(|(k, v)| format!("{k}={v};")).collect();
    let file = cache_file(program, arch, defines);
    if !sys::nvrtc_present() {
        return Err(
            "libnvrtc not found (install the CUDA toolkit's NVRTC or add it to LD_LIBRARY_PATH)"
                .into(),
        );
    }
    let mut opts = vec![
        format!("--gpu-architecture={arch}"),
        "-std=c++17".to_string(),
        "--ptxas-options=-v".to_string(),
    ];
    if let Some(inc) = include_dir() {
        opts.push(format!("--include-path={inc}"));
    }
    for (k, v) in defines {
        opts.push(format!("-D{k}={v}"));
    }
    let source = format!("{COMMON}\n{}", program.source());
    let bin = sys::nvrtc_compile(&source, program.file(), &opts).map_err(|log| {
        format!(
            "NVRTC failed to compile kernels/{} for {arch} with [{}]: {log}",
            program.file(),
            def_text
        )
    })?;
    if let Some(f) = &file {
        if let Some(dir) = f.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        // A cache write failure only costs a recompile next time.
        let _ = crate::util::write_atomic(f, &bin);
    }
    Ok(bin)
}
