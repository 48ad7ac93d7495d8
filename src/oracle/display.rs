//! A verdict in one line for the terminal, the reports and the logs (`{verdict}`).

use super::Verdict;
use std::fmt;

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v = self;
        if let Some(why) = &v.skipped {
            return write!(f, "skipped ({why})");
        }
        if v.is_clean() {
            return write!(
                f,
                "clean ({} rows, {} logits checked, max err/bound {:.3}, calc_diff {:.2e}, guard {})",
                v.metrics.rows_checked,
                v.metrics.checked,
                v.metrics.max_err_over_bound,
                v.metrics.calc_diff,
                if v.guard.redundant {
                    "redundant"
                } else {
                    "NEEDED"
                }
            );
        }
        let classes: Vec<String> = v.classes.iter().map(|(c, n)| format!("{c} x{n}")).collect();
        write!(f, "FINDING {}", classes.join(", "))?;
        if let Some(e) = v.examples.first() {
            write!(f, "; first {}", e.class)?;
            if let (Some(r), Some(t)) = (e.row, e.pos) {
                write!(f, " at row {r} position {t}")?;
            }
            if let Some(x) = e.expected {
                write!(f, " expected {x:e}")?;
            }
            if let Some(g) = &e.got {
                write!(f, " got {g}")?;
            }
            if let Some(d) = &e.detail {
                write!(f, ": {d}")?;
            }
        }
        Ok(())
    }
}
