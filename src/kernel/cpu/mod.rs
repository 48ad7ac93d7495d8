//! CPU kernels: implementations of the production algorithm (`cpu:chunked`), a plain
//! one (`cpu:naive`), and the planted bugs (`cpu:bug-*`) as variants of the chunked
//! code, so each mutant lives in realistic code and fails through its real mechanism.
//! Bugs compose: `cpu:bug-A+B` plants both A and B.

mod chunked;
mod device_view;

pub use chunked::ChunkedKernel;
pub use device_view::{poison_byte, DeviceView};

use super::plant::Plant;
use super::{Kernel, KernelEntry};

/// Every CPU kernel the registry lists.
pub fn entries() -> Vec<KernelEntry> {
    let mut v = vec![
        KernelEntry {
            name: "cpu:chunked".into(),
            description: "production algorithm on the CPU: f32 accumulation, ChunkK=256 chunks, split-KV schedule, chunked stores with -inf masks".into(),
            available: Ok(()),
            planted_bug: false,
        },
        KernelEntry {
            name: "cpu:naive".into(),
            description: "plain f32 loop that writes exactly V(r)".into(),
            available: Ok(()),
            planted_bug: false,
        },
    ];
    for p in Plant::every() {
        v.push(KernelEntry {
            name: format!("cpu:bug-{}", p.name()),
            description: format!("planted bug: {}", p.describe()),
            available: Ok(()),
            planted_bug: true,
        });
    }
    v
}

pub fn open(name: &str) -> Option<Box<dyn Kernel>> {
    match name {
        "cpu:chunked" => Some(Box::new(ChunkedKernel::new(None))),
        "cpu:naive" => Some(Box::new(ChunkedKernel::naive())),
        _ => {
            // `cpu:bug-A+B`: several planted bugs in one kernel (not listed in the
            // registry, which names each bug once).
            let bugs = name.strip_prefix("cpu:bug-")?;
            Plant::parse_set(bugs)
                .map(|v| Box::new(ChunkedKernel::with_plants(v)) as Box<dyn Kernel>)
        }
    }
}
