//! The worker protocol, versions 1 and 2 (specified for adapter writers in
//! `kernels/external/PROTOCOL.md`): the messages, and the tensors of a case.
//!
//! Control travels as JSON lines on the worker's stdin/stdout. Tensors travel, in
//! version 2, through shared-memory regions (`super::shm`) reused case after case, the
//! output written in place in the region the harness judges it from; in version 1, as safetensors files in a per-worker temporary directory.
//! Either way they are the same tensors ([`wire_tensors`]), because a case can hold
//! gigabytes (a 2 GiB output) that no one wants inside a JSON line.

use super::safetensors_stream::{self as st, Data};
use super::shm::ShmTensors;
pub use super::wire::{
    region_layout, table_tail_sent, wire_inputs, wire_tensors, WireInts, WorkerDraws,
};
use crate::case::{BlockTable, Case, ContextLens, DrawnValues, Shape, SparseKvCache, TailRule};
use crate::kernel::{
    Capabilities, CompileField, DeviceJudgeRequest, DeviceJudgement, OutputBuffer, RunError,
    RunInfo, GUARD_ELEMS,
};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

/// The newest protocol version this build speaks.
pub const PROTOCOL_VERSION: u64 = 2;
/// Every version this build speaks; a worker announcing another is refused. mqa-fuzz
/// tells a worker which ones it may choose in `MQA_FUZZ_PROTOCOLS` (`1,2`).
pub const SUPPORTED_PROTOCOLS: [u64; 2] = [1, 2];

/// The versions offered to workers: all of them, or only 1 with
/// `MQA_FUZZ_EXEC_PROTOCOL=1` (to test an adapter's version-1 path).
pub fn offered_protocols() -> Result<Vec<u64>, String> {
    match std::env::var("MQA_FUZZ_EXEC_PROTOCOL") {
        Err(_) => Ok(SUPPORTED_PROTOCOLS.to_vec()),
        Ok(v) => match v.trim().parse::<u64>() {
            Ok(p) if SUPPORTED_PROTOCOLS.contains(&p) => Ok(vec![p]),
            _ => Err(format!(
                "MQA_FUZZ_EXEC_PROTOCOL={v:?}: this mqa-fuzz speaks protocols {SUPPORTED_PROTOCOLS:?}"
            )),
        },
    }
}

/// The version a worker should speak given `MQA_FUZZ_PROTOCOLS` (worker side): the
/// newest both sides know; 1 when the variable is missing (an older mqa-fuzz).
pub fn chosen_protocol(offered: Option<&str>) -> u64 {
    offered
        .into_iter()
        .flat_map(|s| s.split(','))
        .filter_map(|p| p.trim().parse::<u64>().ok())
        .filter(|p| SUPPORTED_PROTOCOLS.contains(p))
        .max()
        .unwrap_or(1)
}

/// The worker's first line.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Hello {
    pub protocol: u64,
    /// What the worker runs (`deepgemm:fp8_fp4_paged_mqa_logits`, `cpu:chunked`, ...).
    pub name: String,
    /// The library under test (`deep_gemm`, `aiter`, `numpy`, `mqa-fuzz`).
    pub library: String,
    pub version: String,
    /// Where it runs (`NVIDIA H200 (sm90)`, `cpu`).
    pub device: String,
    pub capabilities: Capabilities,
    /// The case fields the library compiles its kernel for (optional; see
    /// [`crate::kernel::CompileField`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub compile_key: Vec<CompileField>,
    /// Optional: the worker draws a generated case's keys itself from the value recipe
    /// of a request's `kv_values` (built-in workers; on a GPU, on the device), so the
    /// harness sends block ids only.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub draws_values: bool,
    /// Optional: the worker takes a block table as each row's used entries and the
    /// rule of the rest (a request's `block_table_tail`), so an engine-sized table's
    /// padding does not travel (built-in workers; CUDA ones expand it on the device).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub draws_table_tails: bool,
    /// Optional: the worker judges a request's output on its device when the request
    /// carries `judge` (built-in CUDA workers), and answers with a `judgement`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub judges_on_device: bool,
    /// Optional: seconds the worker spent, before this hello, loading what its first
    /// case would otherwise load (device modules, a library's first-use code).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warm_up_secs: Option<f64>,
}

impl Hello {
    /// What this worker makes itself from a recipe instead of receiving it.
    pub fn draws(&self) -> WorkerDraws {
        WorkerDraws {
            values: self.draws_values,
            table_tails: self.draws_table_tails,
        }
    }
}

/// Why a worker could not run a case (the `kind` of an `error` line).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    Crash,
    Skipped,
    Environment,
}

/// A line from the worker.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum WorkerLine {
    Hello(Box<Hello>),
    Result {
        id: u64,
        /// Version 1: the output file written (the requested path). Version 2: absent,
        /// the output is in the shared region.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        output: Option<String>,
        #[serde(default)]
        kernel_time_us: Option<f64>,
        #[serde(default)]
        inputs_intact: Option<bool>,
        #[serde(default)]
        device_bytes: Option<u64>,
        /// Optional: microseconds per phase of the call as the worker saw it
        /// (`upload`, `kernel`, `download`, ...), for the report's split of the time.
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        phases_us: BTreeMap<String, f64>,
        /// The answer to a request's `judge` (workers whose hello says
        /// `judges_on_device`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        judgement: Option<Box<DeviceJudgement>>,
        /// With a `judgement`: whether the output was written into the region (only
        /// when the judgement holds a finding).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        output_written: Option<bool>,
    },
    Error {
        /// `null` for an error before any request (e.g. the library is not installed).
        #[serde(default)]
        id: Option<u64>,
        kind: ErrorKind,
        message: String,
    },
}

impl WorkerLine {
    pub fn to_line(&self) -> String {
        let mut s = serde_json::to_string(self).expect("worker lines serialize");
        s.push('\n');
        s
    }
}

/// Parses the handshake, checking the version before anything else so that a worker of
/// another protocol version gets a clear message instead of a field error.
pub fn parse_hello(line: &str, offered: &[u64]) -> Result<Hello, RunError> {
    let v: serde_json::Value = serde_json::from_str(line)
        .map_err(|_| RunError::Crash(format!("worker's first line is not JSON: {}", clip(line))))?;
    match v.get("type").and_then(|t| t.as_str()) {
        Some("hello") => {}
        Some("error") => {
            let msg = v
                .get("message")
                .and_then(|m| m.as_str())
                .unwrap_or("(no message)");
            let kind = v
                .get("kind")
                .and_then(|m| m.as_str())
                .unwrap_or("environment");
            return Err(match kind {
                "crash" => RunError::Crash(format!("worker failed to start: {msg}")),
                _ => RunError::Environment(format!("worker cannot run here: {msg}")),
            });
        }
        _ => {
            return Err(RunError::Crash(format!(
                "worker's first line is not a hello: {}",
                clip(line)
            )))
        }
    }
    match v.get("protocol").and_then(|p| p.as_u64()) {
        Some(p) if offered.contains(&p) => {}
        other => {
            let speaks = match offered {
                [one] => format!("protocol {one}"),
                _ => format!("protocols {offered:?}"),
            };
            return Err(RunError::Environment(format!(
                "worker speaks protocol {}, this mqa-fuzz speaks {speaks}: update the adapter or mqa-fuzz",
                other.map(|p| p.to_string()).unwrap_or_else(|| "(missing)".into())
            )));
        }
    }
    let hello: Hello = serde_path_to_error::deserialize(v).map_err(|e| {
        RunError::Environment(format!("worker's hello: field {}: {}", e.path(), e.inner()))
    })?;
    Ok(hello)
}

/// Shortens a line for an error message.
pub fn clip(s: &str) -> String {
    let s = s.trim_end();
    if s.chars().count() <= 200 {
        format!("{s:?}")
    } else {
        format!(
            "{:?}... ({} bytes)",
            s.chars().take(200).collect::<String>(),
            s.len()
        )
    }
}

/// Context lengths as they appear in a request: a list or a list of lists.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum LensWire {
    PerSequence(Vec<i64>),
    PerToken(Vec<Vec<i64>>),
}

/// A `run` line: the scalars of the case, and where its tensors are.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunRequest {
    /// Always `"run"`.
    #[serde(rename = "type")]
    pub kind: String,
    pub id: u64,
    /// Version 1: the case file (safetensors) to read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub case: Option<String>,
    /// Version 1: where to write the output file (safetensors holding `logits`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
    /// Version 2: the shared region and where each tensor lies in it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shm: Option<ShmTensors>,
    /// `batch`, `next_n`, `heads`, `head_dim`, `block_size`, `layout`, `format`.
    #[serde(flatten)]
    pub shape: Shape,
    pub num_blocks: u64,
    pub kv_block_stride: u64,
    /// `num_blocks * kv_block_stride`: the device cache the worker allocates.
    pub kv_cache_bytes: u64,
    pub max_model_len: usize,
    pub out_row_stride: usize,
    /// `batch * next_n`.
    pub rows: usize,
    pub max_blocks: usize,
    pub block_table_stride: usize,
    /// Poisoned f32 elements before and after the `rows * out_row_stride` interior of
    /// the `logits` tensor.
    pub guard_elems: usize,
    pub poison_bits: u32,
    /// Every element of `logits` holds the poison (guards and row padding included),
    /// as in every request of a campaign: a worker may poison its own (device) buffer
    /// instead of reading the region's. Optional (absent: false), so older workers,
    /// which read the region, are unaffected.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub logits_poisoned: bool,
    /// Only to workers whose hello says `draws_values`: the keys are not sent; block
    /// `l` of `kv_block_ids` (in draw order) holds the values the generator draws for
    /// index `l` of this recipe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_values: Option<DrawnValues>,
    /// Only to workers whose hello says `draws_table_tails`: the `block_table` tensor
    /// is 1-D, each row's first `block_table_held[b]` entries back to back; entry `j`
    /// past them of row `b` is this rule's entry of index `b * block_table_stride + j`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_table_tail: Option<TailRule>,
    /// Only to workers whose hello says `judges_on_device` (protocol 2): judge the
    /// output on the device and write it into the region only if the judgement holds a
    /// finding. The region's `logits` are then not poisoned by the harness.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub judge: Option<DeviceJudgeRequest>,
    pub context_lens: LensWire,
}

/// Where a request's tensors are.
pub enum Transport<'a> {
    /// Version 1: a case file to read and an output file to write.
    Files { case: &'a Path, output: &'a Path },
    /// Version 2: the shared region.
    Shm(ShmTensors),
}

impl RunRequest {
    pub fn new(id: u64, case: &Case, transport: Transport) -> Self {
        let s = &case.shape;
        let (case_path, output, shm) = match transport {
            Transport::Files { case, output } => (
                Some(case.display().to_string()),
                Some(output.display().to_string()),
                None,
            ),
            Transport::Shm(t) => (None, None, Some(t)),
        };
        RunRequest {
            kind: "run".into(),
            id,
            case: case_path,
            output,
            shm,
            shape: s.clone(),
            num_blocks: case.num_blocks,
            kv_block_stride: case.kv_block_stride,
            kv_cache_bytes: case.kv_cache_bytes(),
            max_model_len: case.max_model_len,
            out_row_stride: case.out_row_stride,
            rows: case.rows(),
            max_blocks: case.block_table.max_blocks,
            block_table_stride: case.block_table.row_stride,
            guard_elems: GUARD_ELEMS,
            poison_bits: crate::kernel::POISON_BITS,
            logits_poisoned: false,
            kv_values: None,
            block_table_tail: None,
            judge: None,
            context_lens: match &case.context_lens {
                ContextLens::PerSequence(v) => LensWire::PerSequence(v.clone()),
                ContextLens::PerToken(v) => LensWire::PerToken(v.clone()),
            },
        }
    }

    pub fn to_line(&self) -> String {
        let mut s = serde_json::to_string(self).expect("requests serialize");
        s.push('\n');
        s
    }
}

/// Writes the version-1 case file.
pub fn write_case_file(path: &Path, case: &Case, out: &OutputBuffer) -> std::io::Result<()> {
    let ints = WireInts::new(case);
    st::write(path, &wire_tensors(case, &ints, out))
}

/// Reads a worker's output file into the harness's buffer, guards included.
pub fn read_output(path: &Path, out: &mut OutputBuffer) -> Result<(), String> {
    let mut r = st::Reader::open(path)?;
    let (raw, _) = out.raw_mut();
    r.f32s_into("logits", raw)?;
    Ok(())
}

/// Writes an output file (worker side).
pub fn write_output(path: &Path, out: &OutputBuffer) -> std::io::Result<()> {
    let (raw, _) = out.raw();
    st::write(path, &[("logits", vec![raw.len()], Data::F32(raw))])
}

/// Where a worker reads a request's tensors from: a version-1 case file or the
/// version-2 shared region. Each call returns the tensor's shape and data, checked for
/// dtype and size.
pub trait TensorSource {
    fn bytes(&mut self, name: &str) -> Result<(Vec<usize>, Vec<u8>), String>;
    fn i32s(&mut self, name: &str) -> Result<(Vec<usize>, Vec<i32>), String>;
    fn i64s(&mut self, name: &str) -> Result<(Vec<usize>, Vec<i64>), String>;
    fn f32s(&mut self, name: &str) -> Result<(Vec<usize>, Vec<f32>), String>;
    /// An f32 tensor of exactly `dst.len()` elements into `dst`.
    fn f32s_into(&mut self, name: &str, dst: &mut [f32]) -> Result<Vec<usize>, String>;
}

impl TensorSource for st::Reader {
    fn bytes(&mut self, name: &str) -> Result<(Vec<usize>, Vec<u8>), String> {
        st::Reader::bytes(self, name)
    }
    fn i32s(&mut self, name: &str) -> Result<(Vec<usize>, Vec<i32>), String> {
        st::Reader::i32s(self, name)
    }
    fn i64s(&mut self, name: &str) -> Result<(Vec<usize>, Vec<i64>), String> {
        st::Reader::i64s(self, name)
    }
    fn f32s(&mut self, name: &str) -> Result<(Vec<usize>, Vec<f32>), String> {
        st::Reader::f32s(self, name)
    }
    fn f32s_into(&mut self, name: &str, dst: &mut [f32]) -> Result<Vec<usize>, String> {
        st::Reader::f32s_into(self, name, dst)
    }
}

/// Rebuilds the case and the poisoned output buffer from a version-1 request and its
/// file (worker side).
pub fn read_case_file(req: &RunRequest) -> Result<(Case, OutputBuffer), String> {
    let path = Path::new(
        req.case
            .as_deref()
            .ok_or("a version-1 request names no case file")?,
    );
    let mut r = st::Reader::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    read_case(req, &mut r, &path.display().to_string())
}

/// Rebuilds the case and the poisoned output buffer from a request whose tensors come
/// from `r` (`what` names the source in errors). Every size is checked against the
/// request; the case is validated.
pub fn read_case(
    req: &RunRequest,
    r: &mut dyn TensorSource,
    what: &str,
) -> Result<(Case, OutputBuffer), String> {
    let case = read_inputs(req, r, what)?;
    let mut out = OutputBuffer::for_case(&case);
    if !req.logits_poisoned {
        let (raw, _) = out.raw_mut();
        r.f32s_into("logits", raw)
            .map_err(|e| format!("{what}: {e}"))?;
    }
    Ok((case, out))
}

/// The case of a request (its inputs, checked; validated), without the output.
pub fn read_inputs(req: &RunRequest, r: &mut dyn TensorSource, what: &str) -> Result<Case, String> {
    let at = |e: String| format!("{what}: {e}");
    let shape = req.shape.clone();
    // Dimensions first: the sizes below are computed from them (no overflow, no
    // absurd allocation from a hostile request).
    let dims = Case {
        shape: shape.clone(),
        num_blocks: req.num_blocks,
        kv_block_stride: req.kv_block_stride,
        context_lens: ContextLens::PerSequence(Vec::new()),
        block_table: BlockTable::whole(req.max_blocks, req.block_table_stride, Vec::new()),
        max_model_len: req.max_model_len,
        out_row_stride: req.out_row_stride,
        q: Vec::new(),
        weights: Vec::new(),
        kv: SparseKvCache::default(),
    };
    crate::case::validate_shape_dims(&dims)
        .map_err(|e| at(format!("invalid case: {}: {}", e.field, e.message)))?;
    let expect = |name: &str, got: &[usize], want: &[usize]| {
        if got != want {
            Err(at(format!(
                "tensor {name} has shape {got:?}, the request says {want:?}"
            )))
        } else {
            Ok(())
        }
    };
    let (qs, q) = r.bytes("q").map_err(at)?;
    expect(
        "q",
        &qs,
        &[shape.batch, shape.next_n, shape.heads, shape.head_dim],
    )?;
    let (ws, weights) = r.f32s("weights").map_err(at)?;
    expect("weights", &ws, &[shape.rows(), shape.heads])?;
    let (ts, table) = r.i32s("block_table").map_err(at)?;
    let block_table = match req.block_table_tail {
        None => {
            expect("block_table", &ts, &[shape.batch, req.block_table_stride])?;
            BlockTable::whole(req.max_blocks, req.block_table_stride, table)
        }
        Some(rule) => {
            let (hs, held) = r.i32s("block_table_held").map_err(at)?;
            expect("block_table_held", &hs, &[shape.batch])?;
            expect("block_table", &ts, &[table.len()])?;
            if let Some(b) = held.iter().position(|&h| h < 0) {
                return Err(at(format!(
                    "block_table_held[{b}] = {} is negative",
                    held[b]
                )));
            }
            let held = held.iter().map(|&h| h as usize).collect();
            BlockTable::compact(req.max_blocks, req.block_table_stride, table, rule, held)
                .ok_or_else(|| {
                    at(format!(
                        "block_table_held: the counts pass block_table_stride ({}) or do not add up to block_table's {} entries",
                        req.block_table_stride,
                        ts.first().copied().unwrap_or(0)
                    ))
                })?
        }
    };
    let (is, ids) = r.i64s("kv_block_ids").map_err(at)?;
    // One id per block: a 2-D id tensor (or any other shape) would index past the
    // blocks below.
    if is.len() != 1 {
        return Err(at(format!(
            "tensor kv_block_ids has shape {is:?}, expected one dimension"
        )));
    }
    if let Some(k) = ids.iter().position(|&id| id < 0) {
        return Err(at(format!("kv_block_ids[{k}] = {} is negative", ids[k])));
    }
    let kv = match req.kv_values {
        // The keys from their recipe, drawn where they are needed (on the device).
        Some(values) => crate::generate::values::drawn_cache(
            &shape,
            values,
            ids.iter().map(|&id| id as u64).collect(),
        )
        .map_err(|e| at(format!("kv_values: {e}")))?,
        None => {
            let (bs_shape, blocks) = r.bytes("kv_blocks").map_err(at)?;
            let n = is[0];
            expect("kv_blocks", &bs_shape, &[n, shape.block_bytes()])?;
            let mut kv = SparseKvCache::default();
            let bb = shape.block_bytes();
            for (k, (&id, block)) in ids.iter().zip(blocks.chunks_exact(bb.max(1))).enumerate() {
                if kv.insert(id as u64, block.to_vec()).is_some() {
                    return Err(at(format!("kv_block_ids[{k}] = {id} is given twice")));
                }
            }
            kv
        }
    };
    let context_lens = match &req.context_lens {
        LensWire::PerSequence(v) => ContextLens::PerSequence(v.clone()),
        LensWire::PerToken(v) => ContextLens::PerToken(v.clone()),
    };
    let case = Case {
        shape,
        num_blocks: req.num_blocks,
        kv_block_stride: req.kv_block_stride,
        context_lens,
        block_table,
        max_model_len: req.max_model_len,
        out_row_stride: req.out_row_stride,
        q,
        weights,
        kv,
    };
    case.validate()
        .map_err(|e| at(format!("invalid case: {}: {}", e.field, e.message)))?;
    if req.guard_elems != GUARD_ELEMS {
        return Err(at(format!(
            "guard_elems {} differs from this build's {GUARD_ELEMS}",
            req.guard_elems
        )));
    }
    Ok(case)
}

/// A worker's `result` line as the harness's [`RunInfo`].
pub fn run_info(
    kernel_time_us: Option<f64>,
    inputs_intact: Option<bool>,
    device_bytes: Option<u64>,
    phases_us: BTreeMap<String, f64>,
) -> RunInfo {
    RunInfo {
        phases: phases_us
            .into_iter()
            .filter(|(_, t)| t.is_finite() && *t >= 0.0)
            .map(|(k, t)| (k, t / 1e6))
            .collect(),
        kernel_time: kernel_time_us
            .filter(|t| t.is_finite() && *t >= 0.0)
            .map(|t| Duration::from_secs_f64(t / 1e6)),
        inputs_intact,
        device_bytes,
        queue_wait: None,
    }
}

#[cfg(test)]
#[path = "protocol_tests.rs"]
mod tests;
