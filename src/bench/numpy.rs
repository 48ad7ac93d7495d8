//! The numpy column of `bench reference`: the same exact computation through numpy's
//! BLAS-backed f64 matmul, run as a child Python process on the same case tensors.

use crate::case::{Case, ContextLens, ScalePlacement};
use std::path::Path;
use std::process::Command;

/// The script, embedded so the installed binary needs no source tree.
const SCRIPT: &str = include_str!("../../bench/numpy_reference.py");

/// Variables that pin an old OpenBLAS core type / cache size on this kind of machine
/// and slow a current numpy: removed for the numpy child only.
const UNSET_FOR_NUMPY: [&str; 2] = ["OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"];

/// One numpy measurement.
#[derive(Clone, Debug, serde::Serialize)]
pub struct NumpyRun {
    pub threads: usize,
    pub seconds: f64,
    pub repeats: u64,
    pub numpy_version: String,
    /// What threadpoolctl reports about the BLAS (kernel architecture, threads).
    pub blas: serde_json::Value,
    /// numpy's logits, row by row over V(r).
    #[serde(skip)]
    pub values: Vec<f64>,
}

/// The Python interpreter to use (`MQA_FUZZ_PYTHON`, else `python3`).
pub fn python() -> String {
    std::env::var("MQA_FUZZ_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// `Err(why)` when numpy cannot be imported.
pub fn available() -> Result<String, String> {
    let out = Command::new(python())
        .args(["-c", "import numpy; print(numpy.__version__)"])
        .output()
        .map_err(|e| format!("{} not runnable: {e}", python()))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(format!(
            "numpy not importable by {} (pip install numpy threadpoolctl)",
            python()
        ))
    }
}

/// Writes the case tensors, the decode table and the metadata the script needs.
pub fn write_case(case: &Case, placement: ScalePlacement, path: &Path) -> std::io::Result<()> {
    use safetensors::{tensor::TensorView, Dtype};
    let s = &case.shape;
    let e = |e: safetensors::SafeTensorError| std::io::Error::other(e.to_string());
    let le = |xs: &mut dyn Iterator<Item = [u8; 8]>| -> Vec<u8> { xs.flatten().collect() };
    let weights: Vec<u8> = case.weights.iter().flat_map(|w| w.to_le_bytes()).collect();
    let ids = le(&mut case
        .kv
        .ids()
        .into_iter()
        .map(|id| (id as i64).to_le_bytes()));
    let blocks: Vec<u8> = case.kv.iter().flat_map(|(_, b)| b).copied().collect();
    let table_entries = le(&mut case
        .block_table
        .whole_entries()
        .iter()
        .map(|&x| i64::from(x).to_le_bytes()));
    let (lens, lens_shape) = match &case.context_lens {
        ContextLens::PerSequence(v) => (le(&mut v.iter().map(|x| x.to_le_bytes())), vec![s.batch]),
        ContextLens::PerToken(v) => (
            le(&mut v.iter().flatten().map(|x| x.to_le_bytes())),
            vec![s.batch, s.next_n],
        ),
    };
    let table = le(&mut s.format.table().iter().map(|&x| (x as f64).to_le_bytes()));
    let n = case.kv.len();
    let views = vec![
        (
            "q",
            TensorView::new(
                Dtype::U8,
                vec![s.batch, s.next_n, s.heads, s.head_dim],
                &case.q,
            )
            .map_err(e)?,
        ),
        (
            "weights",
            TensorView::new(Dtype::F32, vec![s.rows(), s.heads], &weights).map_err(e)?,
        ),
        (
            "kv_block_ids",
            TensorView::new(Dtype::I64, vec![n], &ids).map_err(e)?,
        ),
        (
            "kv_blocks",
            TensorView::new(Dtype::U8, vec![n, s.block_bytes()], &blocks).map_err(e)?,
        ),
        (
            "block_table",
            TensorView::new(
                Dtype::I64,
                vec![s.batch, case.block_table.row_stride],
                &table_entries,
            )
            .map_err(e)?,
        ),
        (
            "context_lens",
            TensorView::new(Dtype::I64, lens_shape, &lens).map_err(e)?,
        ),
        (
            "table",
            TensorView::new(Dtype::F64, vec![256], &table).map_err(e)?,
        ),
    ];
    let meta = [
        ("block_size", s.block_size.to_string()),
        ("layout", s.layout.name().to_string()),
        ("placement", placement.name().to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let bytes = safetensors::serialize(views, Some(meta)).map_err(e)?;
    crate::util::write_atomic(path, &bytes)
}

/// Runs the script on a case file with `threads` BLAS threads; `dir` holds the script
/// and the output.
pub fn run(
    dir: &Path,
    case_file: &Path,
    threads: usize,
    min_seconds: f64,
) -> Result<NumpyRun, String> {
    let script = dir.join("numpy_reference.py");
    if !script.exists() {
        crate::util::write_atomic(&script, SCRIPT.as_bytes())
            .map_err(|e| format!("writing {}: {e}", script.display()))?;
    }
    let out_file = dir.join(format!("numpy_out_{threads}.safetensors"));
    let mut cmd = Command::new(python());
    cmd.arg(&script)
        .arg(case_file)
        .arg(&out_file)
        .arg(min_seconds.to_string());
    for v in UNSET_FOR_NUMPY {
        cmd.env_remove(v);
    }
    for v in [
        "OPENBLAS_NUM_THREADS",
        "OMP_NUM_THREADS",
        "MKL_NUM_THREADS",
        "BLIS_NUM_THREADS",
    ] {
        cmd.env(v, threads.to_string());
    }
    let out = cmd
        .output()
        .map_err(|e| format!("{} not runnable: {e}", python()))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(format!(
            "numpy script failed: {}",
            err.lines().last().unwrap_or("")
        ));
    }
    let line = String::from_utf8_lossy(&out.stdout);
    let v: serde_json::Value =
        serde_json::from_str(line.trim()).map_err(|e| format!("numpy script output: {e}"))?;
    let bytes =
        std::fs::read(&out_file).map_err(|e| format!("reading {}: {e}", out_file.display()))?;
    let st =
        safetensors::SafeTensors::deserialize(&bytes).map_err(|e| format!("numpy output: {e}"))?;
    let values = st
        .tensor("value")
        .map_err(|e| format!("numpy output: {e}"))?
        .data()
        .chunks_exact(8)
        .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    Ok(NumpyRun {
        threads,
        seconds: v["seconds"].as_f64().unwrap_or(f64::NAN),
        repeats: v["repeats"].as_u64().unwrap_or(0),
        numpy_version: v["numpy"].as_str().unwrap_or("?").to_string(),
        blas: v["blas"].clone(),
        values,
    })
}
