//! Writes the seed corpora of the cargo-fuzz targets (`fuzz/corpus/<target>/`) from
//! the hand-made corpus, so the fuzzer starts from real, valid inputs and mutates
//! them into hostile ones. Deterministic; re-run after a format change.
//!
//! Run: `cargo run --example make_fuzz_seeds` (reads `corpus/`, writes `fuzz/corpus/`).

use mqa_fuzz::case::{load_case_file, tensors_to_safetensors};
use mqa_fuzz::kernel::exec::protocol::{self, RunRequest, WorkerLine};
use mqa_fuzz::kernel::{self, OutputBuffer};
use std::path::Path;

fn framed(json: &[u8], tensors: &[u8]) -> Vec<u8> {
    let mut v = (json.len() as u16).to_le_bytes().to_vec();
    v.extend_from_slice(json);
    v.extend_from_slice(tensors);
    v
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out = Path::new("fuzz/corpus");
    for t in [
        "case_file",
        "worker_protocol",
        "report_merge",
        "case_pipeline",
    ] {
        std::fs::create_dir_all(out.join(t))?;
    }
    let mut names: Vec<_> = std::fs::read_dir("corpus")?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    names.sort();
    let tmp = std::env::temp_dir().join(format!("mqa-fuzz-seeds-{}", std::process::id()));
    std::fs::create_dir_all(&tmp)?;
    for (i, p) in names.iter().enumerate() {
        let text = std::fs::read(p)?;
        let file = load_case_file(p)?;
        let stem = p.file_stem().unwrap().to_string_lossy().into_owned();
        if text.len() <= 16 << 10 {
            std::fs::write(out.join("case_file").join(&stem), framed(&text, &[]))?;
            // The same case with its tensors in a safetensors sibling.
            let mut v: serde_json::Value = serde_json::from_slice(&text)?;
            v["case"]["tensors"] = serde_json::json!({"safetensors": "c.safetensors"});
            let json = serde_json::to_vec(&v)?;
            let st = tensors_to_safetensors(&file.case, false)?;
            std::fs::write(
                out.join("case_file").join(format!("{stem}-safetensors")),
                framed(&json, &st),
            )?;
        }
        // A worker's view: the run line and the case file the harness writes.
        let case_path = tmp.join("case.st");
        let outbuf = OutputBuffer::for_case(&file.case);
        protocol::write_case_file(&case_path, &file.case, &outbuf)?;
        let out = tmp.join("out.st");
        let transport = protocol::Transport::Files {
            case: &case_path,
            output: &out,
        };
        let req = RunRequest::new(i as u64, &file.case, transport);
        let mut seed = req.to_line().into_bytes();
        let bytes = std::fs::read(&case_path)?;
        if bytes.len() <= 64 << 10 {
            seed.extend_from_slice(&bytes);
            std::fs::write(out.join("worker_protocol").join(&stem), seed)?;
        }
    }
    // Worker lines: a hello, a result, errors.
    let caps = kernel::open("cpu:chunked")?.capabilities().clone();
    let hello = WorkerLine::Hello(Box::new(protocol::Hello {
        protocol: protocol::PROTOCOL_VERSION,
        name: "cpu:chunked".into(),
        library: "mqa-fuzz".into(),
        version: "0.1.0".into(),
        device: "cpu".into(),
        capabilities: caps,
        compile_key: Vec::new(),
        draws_values: false,
        draws_table_tails: false,
        judges_on_device: false,
        warm_up_secs: None,
    }));
    let small = OutputBuffer::new(2, 3, 4);
    let out_path = tmp.join("out.st");
    protocol::write_output(&out_path, &small)?;
    let mut result = WorkerLine::Result {
        id: 3,
        output: Some("out.st".into()),
        kernel_time_us: Some(12.5),
        inputs_intact: Some(true),
        device_bytes: Some(4096),
        phases_us: [("kernel".to_string(), 12.5)].into_iter().collect(),
        judgement: None,
        output_written: None,
    }
    .to_line()
    .into_bytes();
    result.extend_from_slice(&std::fs::read(&out_path)?);
    let error = WorkerLine::Error {
        id: None,
        kind: protocol::ErrorKind::Environment,
        message: "deep_gemm is not installed".into(),
    };
    let w = out.join("worker_protocol");
    std::fs::write(w.join("hello"), hello.to_line())?;
    std::fs::write(w.join("result"), result)?;
    std::fs::write(w.join("error"), error.to_line())?;
    std::fs::remove_dir_all(&tmp)?;
    Ok(())
}
