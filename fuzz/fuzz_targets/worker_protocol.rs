//! The worker protocol from the harness's side and the worker's side: any line a
//! worker (or a harness) may send, and any case/output file beside it. Parsing must
//! refuse bad input with a message; never panic, never allocate from an unchecked size.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mqa_fuzz::kernel::exec::protocol::{self, RunRequest, WorkerLine};
use mqa_fuzz::kernel::exec::shm::{SharedRegion, ShmReader};
use mqa_fuzz::kernel::OutputBuffer;

fuzz_target!(|data: &[u8]| {
    // Layout: the first line is a protocol line, the rest the bytes of a tensor file.
    let split = data.iter().position(|&b| b == b'\n').unwrap_or(data.len());
    let line = String::from_utf8_lossy(&data[..split]);
    let file = data.get(split + 1..).unwrap_or(&[]);

    let _ = protocol::parse_hello(&line, &protocol::SUPPORTED_PROTOCOLS);
    let _ = serde_json::from_str::<WorkerLine>(&line);
    let _ = protocol::clip(&line);

    let path = std::env::temp_dir().join(format!("mqa-fuzz-protocol-{}.st", std::process::id()));
    std::fs::write(&path, file).expect("temp file");
    if let Ok(mut req) = serde_json::from_str::<RunRequest>(&line) {
        req.case = Some(path.display().to_string());
        if let Ok((case, out)) = protocol::read_case_file(&req) {
            case.validate()
                .expect("a case the worker accepts validates");
            assert_eq!(out.interior().len(), case.rows() * case.out_row_stride);
        }
        // Protocol 2: the same bytes in a shared region, at the offsets the line says.
        if let Some(mut shm) = req.shm.clone() {
            let mut region = SharedRegion::create("mqa-fuzz-fuzz").expect("region");
            region.ensure(file.len().max(1)).expect("region size");
            region.bytes_mut()[..file.len()].copy_from_slice(file);
            shm.path = region.path().to_string();
            let mut src = ShmReader {
                region: &region,
                layout: &shm,
            };
            if let Ok((case, out)) = protocol::read_case(&req, &mut src, "fuzz") {
                case.validate()
                    .expect("a case the worker accepts validates");
                assert_eq!(out.interior().len(), case.rows() * case.out_row_stride);
            }
        }
    }
    // The harness reading a worker's output into a small buffer.
    let mut out = OutputBuffer::new(2, 3, 4);
    let _ = protocol::read_output(&path, &mut out);
});
