//! Progress: a bar with cases/s and findings on a terminal, plain periodic lines
//! otherwise (CI logs), nothing when quiet.

use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::time::{Duration, Instant};

pub struct Progress {
    quiet: bool,
    bar: Option<ProgressBar>,
    plain: bool,
    start: Instant,
    last_line: Instant,
    budget: Option<Duration>,
}

impl Progress {
    pub fn new(quiet: bool, budget: Option<Duration>, max_cases: Option<u64>) -> Self {
        let tty = std::io::stderr().is_terminal();
        let bar = (!quiet && tty).then(|| {
            let b = match max_cases {
                Some(n) => ProgressBar::new(n),
                None => ProgressBar::new_spinner(),
            };
            b.set_style(
                ProgressStyle::with_template(
                    "{spinner} [{elapsed_precise}] {pos} cases ({per_sec}) {msg}",
                )
                .unwrap_or_else(|_| ProgressStyle::default_spinner()),
            );
            b.enable_steady_tick(Duration::from_millis(200));
            b
        });
        Progress {
            quiet,
            bar,
            plain: !quiet && !tty,
            start: Instant::now(),
            last_line: Instant::now(),
            budget,
        }
    }

    pub fn update(&mut self, cases: u64, findings: usize, phase: &str) {
        if let Some(b) = &self.bar {
            b.set_position(cases);
            b.set_message(format!("{findings} distinct bug(s) {phase}"));
        } else if self.plain && self.last_line.elapsed() >= Duration::from_secs(10) {
            self.last_line = Instant::now();
            let el = self.start.elapsed().as_secs_f64();
            let budget = self
                .budget
                .map(|b| format!(" of {:.0}s", b.as_secs_f64()))
                .unwrap_or_default();
            eprintln!("mqa-fuzz: {el:.0}s{budget}: {cases} cases ({:.1}/s), {findings} distinct bug(s) {phase}", cases as f64 / el.max(1e-9));
        }
    }

    /// Prints a line without breaking the bar.
    pub fn println(&self, line: &str) {
        match &self.bar {
            Some(b) => b.println(line),
            None if !self.quiet => eprintln!("{line}"),
            None => {}
        }
    }

    /// Prints a warning even when quiet: something the user must know (a finding that
    /// could not be saved where asked).
    pub fn warn(&self, line: &str) {
        match &self.bar {
            Some(b) => b.println(line),
            None => eprintln!("{line}"),
        }
    }

    pub fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}
