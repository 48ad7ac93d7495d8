//! The worker side of the protocol for built-in kernels: `mqa-fuzz worker --kernel NAME`
//! serves any kernel `kernel::open` knows (the caller opens it), so an in-process kernel (a CUDA kernel that
//! may hit an illegal address) can run isolated in a child process whose death costs
//! one case, not the campaign.
//!
//! `--fault` makes the worker misbehave on purpose, so the client's handling of dying,
//! hanging, babbling and outdated workers is tested against a real process.

use super::protocol::{self, ErrorKind, Hello, RunRequest, WorkerLine, PROTOCOL_VERSION};
use super::shm::{MappedOutput, SharedRegion, ShmReader, ShmTensors};
use crate::case::Case;
use crate::error::{exit, Fatal};
use crate::kernel::{Kernel, OpenError, OutputBuffer, RunError};
use std::collections::BTreeMap;
use std::io::{BufRead, Read, Write};
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

/// A misbehaviour on purpose, counted in requests served by this process (from 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Abort (SIGABRT) on request N, like a device fault taking the process down.
    CrashAt(u64),
    /// Stop answering on request N.
    HangAt(u64),
    /// Print a line that is not JSON on request N.
    GarbageAt(u64),
    /// Answer request N with another id.
    WrongIdAt(u64),
    /// Answer request N with a `crash` error, then exit (what adapters do after a
    /// device fault).
    FaultExitAt(u64),
    /// Answer every request whose batch is all zero-length sequences with a `crash`
    /// error, then exit: a library's crash with a trigger (DeepGEMM #353), for the
    /// campaign's handling of known crashes.
    FaultExitOnZeroBatch,
    /// Announce a protocol version this build does not speak (the newest + 1).
    Skew,
}

impl Fault {
    pub fn parse(s: &str) -> Result<Fault, String> {
        match s {
            "skew" => return Ok(Fault::Skew),
            "fault-exit-on=all-zero-batch" => return Ok(Fault::FaultExitOnZeroBatch),
            _ => {}
        }
        let (what, n) = s
            .split_once('=')
            .ok_or_else(|| format!("--fault {s:?}: expected KIND=N or skew"))?;
        let n: u64 = n
            .parse()
            .map_err(|_| format!("--fault {s:?}: {n:?} is not a request number"))?;
        match what {
            "crash-at" => Ok(Fault::CrashAt(n)),
            "hang-at" => Ok(Fault::HangAt(n)),
            "garbage-at" => Ok(Fault::GarbageAt(n)),
            "wrong-id-at" => Ok(Fault::WrongIdAt(n)),
            "fault-exit-at" => Ok(Fault::FaultExitAt(n)),
            _ => Err(format!(
                "--fault {s:?}: kinds are crash-at, hang-at, garbage-at, wrong-id-at, fault-exit-at (=N), fault-exit-on=all-zero-batch, skew"
            )),
        }
    }
}

fn send(out: &mut (impl Write + ?Sized), line: &WorkerLine) -> std::io::Result<()> {
    out.write_all(line.to_line().as_bytes())?;
    out.flush()
}

/// Serves `kernel_name` on stdin/stdout until stdin closes. The caller opens the kernel
/// (`kernel::open(kernel_name)`: the registry sits above the backends, this one included).
pub fn serve(
    kernel_name: &str,
    opened: Result<Box<dyn Kernel>, OpenError>,
    fault: Option<Fault>,
) -> Result<i32, Fatal> {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let io = |e: std::io::Error| Fatal::environment(format!("worker: cannot write to stdout: {e}"));
    let k = match opened {
        Ok(k) => k,
        Err(e) => {
            let msg = e.to_string();
            send(
                &mut out,
                &WorkerLine::Error {
                    id: None,
                    kind: ErrorKind::Environment,
                    message: msg.clone(),
                },
            )
            .map_err(io)?;
            return Err(Fatal::from(e));
        }
    };
    let mut device = if kernel_name.starts_with("cpu:") {
        "cpu".to_string()
    } else {
        kernel_name.split(':').next().unwrap_or("").to_string()
    };
    if let Ok(d) = std::env::var(super::config::WORKER_DEVICE) {
        device.push_str(&format!(" (device {d})"));
    }
    let hello = Hello {
        protocol: if fault == Some(Fault::Skew) {
            PROTOCOL_VERSION + 1
        } else {
            protocol::chosen_protocol(std::env::var("MQA_FUZZ_PROTOCOLS").ok().as_deref())
        },
        name: k.name().to_string(),
        library: "mqa-fuzz".into(),
        version: k.version(),
        device,
        capabilities: k.capabilities().clone(),
        compile_key: k.compile_key().to_vec(),
        // Built-in workers draw a generated case's keys from its recipe: on the device
        // for CUDA kernels, here for the others.
        draws_values: true,
        // And a generated table's padding from its rule: on the device for CUDA
        // kernels (`kernels/generate.cu`'s `table_tail`), here for the others.
        draws_table_tails: true,
        judges_on_device: k.device_judge().is_ok(),
        warm_up_secs: None,
    };
    serve_on(
        k.as_ref(),
        hello,
        Box::new(std::io::stdin()),
        &mut out,
        fault,
    )
}

/// Sends `hello`, then answers the requests read from `input` on `out` until `input`
/// closes (exit status 0) or the kernel's device is lost to a fault (after answering
/// that request: [`FAULTED_STATUS`]). `mqa-fuzz worker` serves stdin/stdout; a
/// process hosting this crate ([`crate::hosted`]) serves the pipes it was given.
pub fn serve_on(
    k: &dyn Kernel,
    hello: Hello,
    input: Box<dyn Read + Send>,
    out: &mut dyn Write,
    fault: Option<Fault>,
) -> Result<i32, Fatal> {
    let mut out = out;
    let io =
        |e: std::io::Error| Fatal::environment(format!("worker: cannot write its answers: {e}"));
    let mut hello = hello;
    if super::config::warm_up_wanted() {
        let t0 = Instant::now();
        match k.warm_up() {
            Ok(Some(_)) => {
                let own = t0.elapsed().as_secs_f64();
                hello.warm_up_secs = Some(hello.warm_up_secs.unwrap_or(0.0) + own);
            }
            Ok(None) => {}
            Err(e) => eprintln!("mqa-fuzz worker: warm-up skipped: {e}"),
        }
    }
    send(&mut out, &WorkerLine::Hello(Box::new(hello))).map_err(io)?;
    // Requests are read (parsed, and their case read out of the region) by a thread of
    // their own, one ahead: a request sent before the answer to the one running is read
    // while that one runs on the device (the harness's pool sends one at a time per
    // worker today; a Python adapter reads in order either way).
    let (tx, rx) = std::sync::mpsc::sync_channel::<Incoming>(1);
    std::thread::Builder::new()
        .name("worker-reader".into())
        .spawn(move || read_requests(tx, input))
        .map_err(|e| Fatal::environment(format!("worker: cannot start its reader: {e}")))?;
    let mut served = 0u64;
    for incoming in rx {
        served += 1;
        let (req, read, read_secs) = match incoming {
            Incoming::Unreadable(e) => return Err(Fatal::environment(e)),
            Incoming::Bad { id, message } => {
                send(
                    &mut out,
                    &WorkerLine::Error {
                        id,
                        kind: ErrorKind::Crash,
                        message,
                    },
                )
                .map_err(io)?;
                continue;
            }
            Incoming::Request(r) => (r.req, r.read, r.read_secs),
        };
        match fault {
            Some(Fault::CrashAt(n)) if n == served => {
                eprintln!(
                    "mqa-fuzz worker: fault injection: aborting on request {served} (id {})",
                    req.id
                );
                std::process::abort();
            }
            Some(Fault::HangAt(n)) if n == served => {
                eprintln!("mqa-fuzz worker: fault injection: hanging on request {served}");
                loop {
                    std::thread::park();
                }
            }
            Some(Fault::GarbageAt(n)) if n == served => {
                eprintln!("mqa-fuzz worker: fault injection: printing garbage on request {served}");
                out.write_all(b"Segmentation fault? no, just chatter on stdout\n")
                    .map_err(io)?;
                out.flush().map_err(io)?;
                continue;
            }
            Some(Fault::FaultExitAt(n)) if n == served => fault_exit(&mut out, &req, served)?,
            Some(Fault::FaultExitOnZeroBatch) if zero_batch(&read) => {
                fault_exit(&mut out, &req, served)?
            }
            _ => {}
        }
        let mut reply = answer(k, &req, read, read_secs);
        if served == 1 {
            mark_first_case(&mut reply);
        }
        if fault == Some(Fault::WrongIdAt(served)) {
            if let WorkerLine::Result { id, .. } | WorkerLine::Error { id: Some(id), .. } =
                &mut reply
            {
                *id += 1;
            }
        }
        send(&mut out, &reply).map_err(io)?;
        if k.lost() {
            eprintln!("mqa-fuzz worker: the device was lost to a fault; stopping so a fresh worker takes the next case");
            return Ok(FAULTED_STATUS);
        }
    }
    Ok(exit::CLEAN)
}

/// Answers `req` with a simulated device fault and exits (`--fault fault-exit-…`).
fn fault_exit(out: &mut dyn Write, req: &RunRequest, served: u64) -> Result<(), Fatal> {
    let line = WorkerLine::Error {
        id: Some(req.id),
        kind: ErrorKind::Crash,
        message: "fault injection: simulated illegal memory access".into(),
    };
    send(out, &line)
        .map_err(|e| Fatal::environment(format!("worker: cannot write its answers: {e}")))?;
    eprintln!("mqa-fuzz worker: fault injection: exiting after a device fault on request {served}");
    std::process::exit(1);
}

/// Whether a request's case (when it could be read) is a batch of empty sequences.
fn zero_batch(read: &Result<(Case, OutputBuffer, bool), String>) -> bool {
    read.as_ref()
        .is_ok_and(|(c, _, _)| (0..c.shape.batch).all(|b| c.seq_tokens(b) == 0))
}

/// Names the phases of a worker's first case apart (`launch [first case of a worker]`):
/// what a worker life pays once (modules loaded, a library's JIT cache read, memory
/// mapped) shows apart from the steady cost, and a campaign with many restarts says so.
fn mark_first_case(reply: &mut WorkerLine) {
    if let WorkerLine::Result { phases_us, .. } = reply {
        *phases_us = std::mem::take(phases_us)
            .into_iter()
            .map(|(k, v)| (format!("{k} {FIRST_CASE}"), v))
            .collect();
    }
}

/// The suffix of a first case's phase names ([`mark_first_case`]).
pub const FIRST_CASE: &str = "[first case of a worker]";

/// A server's status after its kernel's device was lost to a fault (EX_SOFTWARE).
pub const FAULTED_STATUS: i32 = 70;

/// A request and its case, read out of its region (or why not).
struct ReadRequest {
    req: RunRequest,
    read: Result<(Case, OutputBuffer, bool), String>,
    read_secs: f64,
}

/// What the reader hands the serving loop, in the order the lines came.
enum Incoming {
    Request(Box<ReadRequest>),
    /// A line that is not a request: answered with a `crash` error.
    Bad {
        id: Option<u64>,
        message: String,
    },
    /// Stdin broke.
    Unreadable(String),
}

/// The reader thread: every line of stdin made into an [`Incoming`] until stdin closes
/// (or the serving loop is gone).
fn read_requests(tx: std::sync::mpsc::SyncSender<Incoming>, input: Box<dyn Read + Send>) {
    // Protocol 2: the client's regions, each mapped once and again only when it grows.
    let mut regions: Vec<Arc<SharedRegion>> = Vec::new();
    // Decoding a request's tables runs on half the cores, so the serving loop (which
    // waits on the device, spinning) is not starved of a core meanwhile.
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads((cores / 2).max(1))
        .thread_name(|i| format!("worker-reader-{i}"))
        .build()
        .ok();
    for line in std::io::BufReader::new(input).lines() {
        let incoming = match line {
            Err(e) => Incoming::Unreadable(format!("worker: cannot read its requests: {e}")),
            Ok(line) if line.trim().is_empty() => continue,
            Ok(line) => match serde_json::from_str::<RunRequest>(&line) {
                Err(e) => Incoming::Bad {
                    id: serde_json::from_str::<serde_json::Value>(&line)
                        .ok()
                        .and_then(|v| v.get("id")?.as_u64()),
                    message: format!("bad request ({e}): {}", protocol::clip(&line)),
                },
                Ok(req) => {
                    let t0 = Instant::now();
                    let read = match &pool {
                        Some(p) => p.install(|| read_request(&req, &mut regions)),
                        None => read_request(&req, &mut regions),
                    };
                    Incoming::Request(Box::new(ReadRequest {
                        req,
                        read,
                        read_secs: t0.elapsed().as_secs_f64(),
                    }))
                }
            },
        };
        let stop = matches!(incoming, Incoming::Unreadable(_));
        if tx.send(incoming).is_err() || stop {
            return;
        }
    }
}

/// Regions a worker keeps mapped (the harness rotates the regions its output buffers
/// live in, one per case in flight): mapped once each, remapped only when one grew.
const MAPPINGS_KEPT: usize = 16;

/// Maps the request's region, reusing a mapping of the same path that is large enough.
fn map_region(
    shm: &ShmTensors,
    regions: &mut Vec<Arc<SharedRegion>>,
) -> Result<Arc<SharedRegion>, String> {
    let k = match regions.iter().position(|r| r.path() == shm.path) {
        Some(k) if regions[k].len() >= shm.bytes => k,
        found => {
            if let Some(k) = found {
                regions.remove(k);
            }
            if regions.len() >= MAPPINGS_KEPT {
                regions.remove(0);
            }
            let r = SharedRegion::open(&shm.path, shm.bytes)
                .map_err(|e| format!("cannot map the shared region {}: {e}", shm.path))?;
            regions.push(Arc::new(r));
            regions.len() - 1
        }
    };
    Ok(regions[k].clone())
}

/// Reads the request's case from its file (protocol 1), or from the shared region (2)
/// with the output buffer over the region's `logits`, written in place.
fn read_request(
    req: &RunRequest,
    regions: &mut Vec<Arc<SharedRegion>>,
) -> Result<(Case, OutputBuffer, bool), String> {
    match &req.shm {
        None => protocol::read_case_file(req).map(|(c, o)| (c, o, false)),
        Some(shm) => {
            let r = map_region(shm, regions)?;
            let mut src = ShmReader {
                region: &r,
                layout: shm,
            };
            let case = protocol::read_inputs(req, &mut src, &shm.path)?;
            // SAFETY: only the kernel touches the region's `logits` until the request
            // is answered (its inputs were read above; the next request the reader
            // reads is in another region, the client's regions being one per case in
            // flight).
            let storage = unsafe { MappedOutput::new(r, shm)? };
            let out = OutputBuffer::over(
                case.rows(),
                case.max_model_len,
                case.out_row_stride,
                Box::new(storage),
                req.logits_poisoned,
            );
            Ok((case, out, true))
        }
    }
}

/// Hands the output back as a file (protocol 1; protocol 2 writes in place).
fn write_answer(req: &RunRequest, buf: &OutputBuffer) -> Result<(), String> {
    match &req.output {
        Some(path) => protocol::write_output(Path::new(path), buf)
            .map_err(|e| format!("cannot write {path}: {e}")),
        None => Err("the request names neither an output file nor a region".into()),
    }
}

/// Runs one request and builds its answer line.
fn answer(
    k: &dyn Kernel,
    req: &RunRequest,
    read: Result<(Case, OutputBuffer, bool), String>,
    read_secs: f64,
) -> WorkerLine {
    let error = |kind, message| WorkerLine::Error {
        id: Some(req.id),
        kind,
        message,
    };
    let (mut case, mut buf, in_place) = match read {
        Ok(x) => x,
        Err(e) => return error(ErrorKind::Crash, format!("bad case: {e}")),
    };
    // Not the memory limit of this life's hello: see `Capabilities::rejects_shape`.
    if let Some(why) = k.capabilities().rejects_shape(&case) {
        return error(ErrorKind::Skipped, why);
    }
    // Keys sent as their recipe: drawn here, before the kernel's clock starts, unless
    // the kernel draws them on its device.
    let t_draw = Instant::now();
    if !k.on_accelerator() {
        case.kv.materialize();
        case.block_table.expand();
    }
    let draw_secs = t_draw.elapsed().as_secs_f64();
    if let Some(judge) = &req.judge {
        return answer_judged(k, req, judge, &case, &mut buf, in_place, read_secs);
    }
    let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| k.run(&case, &mut buf)));
    match ran {
        Err(p) => error(ErrorKind::Crash, panic_message(p)),
        Ok(Err(e)) => run_error(req.id, e),
        Ok(Ok(info)) => {
            let t1 = Instant::now();
            let written = if in_place {
                Ok(())
            } else {
                write_answer(req, &buf)
            };
            match written {
                Err(e) => error(ErrorKind::Environment, e),
                Ok(()) => WorkerLine::Result {
                    id: req.id,
                    output: req.output.clone(),
                    kernel_time_us: info.kernel_time.map(|t| t.as_secs_f64() * 1e6),
                    inputs_intact: info.inputs_intact,
                    device_bytes: info.device_bytes,
                    phases_us: phases_us(
                        &info.phases,
                        read_secs,
                        draw_secs,
                        t1.elapsed().as_secs_f64(),
                    ),
                    judgement: None,
                    output_written: None,
                },
            }
        }
    }
}

/// A request with `judge`: the kernel runs and judges on its device; the output is in
/// the region only when the judgement says so (protocol 2 only: a judged output has no
/// file to go to).
fn answer_judged(
    k: &dyn Kernel,
    req: &RunRequest,
    judge: &crate::kernel::DeviceJudgeRequest,
    case: &Case,
    buf: &mut OutputBuffer,
    in_place: bool,
    read_secs: f64,
) -> WorkerLine {
    let error = |kind, message| WorkerLine::Error {
        id: Some(req.id),
        kind,
        message,
    };
    if !in_place {
        return error(
            ErrorKind::Crash,
            "a request to judge on the device needs protocol 2 (a shared region)".into(),
        );
    }
    let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        k.run_judged(case, judge, buf)
    }));
    match ran {
        Err(p) => error(ErrorKind::Crash, panic_message(p)),
        Ok(Err(e)) => run_error(req.id, e),
        Ok(Ok(run)) => WorkerLine::Result {
            id: req.id,
            output: None,
            kernel_time_us: run.info.kernel_time.map(|t| t.as_secs_f64() * 1e6),
            inputs_intact: run.info.inputs_intact,
            device_bytes: run.info.device_bytes,
            phases_us: phases_us(&run.info.phases, read_secs, 0.0, 0.0),
            judgement: Some(Box::new(run.judgement)),
            output_written: Some(run.output_written),
        },
    }
}

/// A kernel's panic as the message of a `crash` line.
fn panic_message(p: Box<dyn std::any::Any + Send>) -> String {
    let what = p
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "(no message)".into());
    format!("kernel panicked: {what}")
}

/// A run's error as the `error` line of request `id`.
fn run_error(id: u64, e: RunError) -> WorkerLine {
    let (kind, message) = match e {
        RunError::Crash(m) => (ErrorKind::Crash, m),
        RunError::Skipped(m) => (ErrorKind::Skipped, m),
        RunError::Environment(m) => (ErrorKind::Environment, m),
    };
    WorkerLine::Error {
        id: Some(id),
        kind,
        message,
    }
}

/// The kernel's phases and the worker's own reading of the case and writing of the
/// output, in microseconds (the `phases_us` of a result line).
fn phases_us(
    kernel: &BTreeMap<String, f64>,
    read: f64,
    draw: f64,
    write: f64,
) -> BTreeMap<String, f64> {
    let mut p: BTreeMap<String, f64> = kernel.iter().map(|(k, t)| (k.clone(), t * 1e6)).collect();
    // Read by the reader thread; it overlaps the run before only when the client has
    // sent this request before that answer (today it sends one at a time).
    p.insert("worker: read case".into(), read * 1e6);
    if draw > 0.0 {
        p.insert("worker: draw values".into(), draw * 1e6);
    }
    p.insert("worker: write output".into(), write * 1e6);
    p
}
