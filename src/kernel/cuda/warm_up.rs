//! What a worker loads before its first case: the device functions every case of a
//! device-judged worker uses (laying the case out, checking the inputs, drawing values,
//! the exact reference, the judge), so that a worker life started ahead of a restart
//! (a spare) takes its first case at full speed. Only cubins already in the disk cache
//! are loaded: compiling a variant that no case may need is not a warm-up.

use super::compile::{Defines, Program};
use super::device::{with_gpu, GpuFailure};
use super::reference_tuning::ReferenceTuning;
use crate::case::Shape;
use crate::kernel::Capabilities;

/// The functions of the harness side of a case (`memory`, `pool`, `generate`, `judge`),
/// in the programs that hold them; each program's source declares each of them
/// `extern "C" __global__` (a test checks).
pub const HARNESS_FUNCTIONS: [(Program, &str); 14] = [
    (Program::Util, "poison_span"),
    (Program::Util, "scatter_blocks"),
    (Program::Util, "hash_words"),
    (Program::Util, "verify_kv_stream"),
    (Program::Util, "verify_kv"),
    (Program::Generate, "pipeline_rows"),
    (Program::Generate, "pipeline_blocks"),
    (Program::Generate, "pipeline_blocks_at"),
    (Program::Generate, "table_tail"),
    (Program::Judge, "judge_rows"),
    (Program::Judge, "judge_pending"),
    (Program::Judge, "count_changed"),
    (Program::Judge, "gather_checks"),
    (Program::Judge, "digest_rows"),
];

/// The exact reference's variants the kernel's shapes can need: one per (H, D) it
/// declares that the device judge takes (a kernel that declares none: DeepSeek's
/// indexer shape, H 64 and D 128), each with the tuning [`ReferenceTuning::for_shape`]
/// picks on a device of compute capability `major`.
pub fn reference_variants(caps: &Capabilities, major: u32) -> Vec<Defines> {
    let heads = caps.heads.clone().unwrap_or_else(|| vec![64]);
    let dims = caps.head_dims.clone().unwrap_or_else(|| vec![128]);
    let mut out: Vec<Defines> = Vec::new();
    for &h in &heads {
        for &d in &dims {
            let shape = Shape {
                batch: 1,
                next_n: 1,
                heads: h,
                head_dim: d,
                block_size: 64,
                layout: crate::ValueLayout::Normal,
                format: crate::Fp8Format::E4m3fn,
            };
            if crate::kernel::device_judge::rejects(&shape).is_some() {
                continue;
            }
            let defines = ReferenceTuning::for_shape(&shape, major).defines(d);
            if !out.contains(&defines) {
                out.push(defines);
            }
        }
    }
    out
}

/// What a warm-up did, for the worker's stderr.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WarmedUp {
    /// Functions loaded (or loaded already).
    pub loaded: usize,
    /// Functions whose cubin was not in the disk cache (their first case compiles them).
    pub not_cached: usize,
    pub secs: f64,
}

/// Opens the device and loads the harness's functions and the reference variants for
/// `caps`. `Err`: the device cannot be opened or a cached cubin does not load (the
/// first case meets the same and reports it).
pub fn warm_up(caps: &Capabilities) -> Result<WarmedUp, String> {
    let t0 = std::time::Instant::now();
    let mut w = WarmedUp::default();
    with_gpu(|gpu| {
        let mut wanted: Vec<(Program, &str, Defines)> = HARNESS_FUNCTIONS
            .iter()
            .map(|&(p, n)| (p, n, Vec::new()))
            .collect();
        for d in reference_variants(caps, gpu.major) {
            wanted.push((Program::Reference, "reference_f64", d));
        }
        for (program, name, defines) in &wanted {
            match gpu.preload(*program, name, defines) {
                Ok(true) => w.loaded += 1,
                Ok(false) => w.not_cached += 1,
                Err(e) => return Err(GpuFailure::Environment(e)),
            }
        }
        Ok(())
    })
    .map_err(|e| match e {
        GpuFailure::Environment(m)
        | GpuFailure::Fault(m)
        | GpuFailure::OutOfMemory(m)
        | GpuFailure::Skipped(m)
        | GpuFailure::Raised(m) => m,
    })?;
    w.secs = t0.elapsed().as_secs_f64();
    Ok(w)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::Capabilities;

    #[test]
    fn every_listed_function_is_a_kernel_of_its_program() {
        for (program, name) in HARNESS_FUNCTIONS {
            let src = program.source();
            let declared = src.lines().any(|l| {
                l.starts_with("extern \"C\" __global__") && l.contains(&format!(" {name}("))
            });
            assert!(
                declared,
                "{name} is not a kernel of kernels/{}",
                program.file()
            );
        }
    }

    #[test]
    fn reference_variants_follow_the_declared_shapes() {
        let mut caps = Capabilities::everything(crate::ScalePlacement::AfterReluSum);
        caps.heads = None;
        caps.head_dims = None;
        let one = reference_variants(&caps, 9);
        assert_eq!(one.len(), 1);
        assert!(one[0].contains(&("DD".to_string(), "128".to_string())));
        // DeepGEMM's declaration: every D it declares gets the reference's variant.
        caps.heads = Some(vec![32, 64]);
        caps.head_dims = Some(vec![32, 64, 128]);
        let v = reference_variants(&caps, 9);
        for d in ["32", "64", "128"] {
            assert!(
                v.iter()
                    .any(|x| x.contains(&("DD".to_string(), d.to_string()))),
                "no variant for D {d}: {v:?}"
            );
        }
        assert!(v.len() <= 6);
        // Heads the device judge refuses (H % 8 != 0) need no reference.
        caps.heads = Some(vec![1, 7]);
        assert!(reference_variants(&caps, 9).is_empty());
    }
}
