//! Where a case is made and run: the [`Engine`] turns a case number into a draw, a
//! recipe fitted to the kernels and a case ([`Engine::draw_case`]), runs it on every
//! kernel and judges it ([`Engine::judge_drawn`]); corpus files are judged the same way
//! ([`Engine::judge_file`]). What it returns is what the campaign's events carry.

use super::{value_tree, Config};
use crate::case::Case;
use crate::generate::epoch::{self, Epochs};
use crate::generate::strategy::draw_strategy_scaled;
use crate::generate::{Draw, Profile, Recipe};
use crate::harness::{self, ReferenceCache};
use crate::kernel::{self, Kernel};
use crate::oracle::{Class, OracleConfig, Verdict};
use crate::reference::verify::VerifyMode;
use proptest::strategy::{SBoxedStrategy, Strategy};
use std::time::Instant;

pub(super) struct Engine<'a> {
    pub cfg: &'a Config,
    pub kernels: Vec<Box<dyn Kernel>>,
    pub profile: Profile,
    /// The production profile's context-length scale in force.
    pub scale: f64,
    /// How the other profiles' cases are verified.
    pub verify: VerifyMode,
    /// How production (engine-model) cases are verified.
    pub production_verify: VerifyMode,
    /// Shape epochs over the kernels' compile key (`--shape-epoch`; `None`: off).
    pub epochs: Option<Epochs>,
    /// Consecutive production cases per deployment (`--deployment-epoch`; `None`: off;
    /// see `generate::epoch`).
    pub deployments: Option<u64>,
    /// Whether a kernel is judged on the CPU: then every case's keys are drawn on the
    /// host with the case (else a GPU worker draws them, and the host only the few
    /// blocks its re-check reads).
    pub host_values: bool,
}

/// One kernel's judged run of a case.
pub(super) struct KernelRun {
    pub verdict: Verdict,
    /// The run's wall time, and the part of it spent on the output buffer.
    pub wall_secs: f64,
    pub setup_secs: f64,
    /// Time the oracle took (the reference excluded).
    pub judge_secs: f64,
    /// The property checks of a generated case (`crate::property::check_case`).
    pub properties: Vec<crate::property::PropertyOutcome>,
    /// Where it was judged: `Ok((elements re-checked, fetched for the CPU judge))` on
    /// the device, `Err(why the CPU)`.
    pub judged_on: Result<(u64, bool), String>,
}

/// A case judged on every kernel (generated or replayed).
pub(super) struct Judgement {
    pub runs: Vec<KernelRun>,
    /// The first kernel that disagrees with the first one (its index), and where.
    pub divergence: Option<(usize, String)>,
    pub environment_error: Option<String>,
    pub reference_secs: f64,
}

/// Where a generated case came from.
pub(super) struct Generated {
    pub k: u64,
    pub seed: u64,
    pub recipe: Recipe,
    /// What fitting the draw to the kernels changed.
    pub adjustments: Vec<String>,
    pub generate_secs: f64,
}

/// A generated case, not yet run.
pub(super) struct Drawn {
    pub generated: Generated,
    pub case: Case,
}

/// One generated case, run on every kernel.
pub(super) struct CaseDone {
    pub generated: Generated,
    pub case: Case,
    pub judgement: Judgement,
}

impl Engine<'_> {
    /// The property checks in force for `kernel` (`--repeat`, `--batch-invariance`).
    pub fn property_plan(&self, kernel: &dyn Kernel) -> crate::property::Plan {
        self.cfg
            .properties
            .plan(kernel.on_accelerator(), self.profile)
    }

    /// How a case of `recipe` is verified.
    fn verify_for(&self, recipe: &Recipe) -> VerifyMode {
        if matches!(recipe.knobs.offsets, crate::generate::OffsetClass::Pool(_)) {
            self.production_verify
        } else {
            self.verify
        }
    }

    /// The strategy of case `k`.
    pub fn strategy(&self, k: u64) -> SBoxedStrategy<Draw> {
        draw_strategy_scaled(self.profile, k, self.scale)
    }

    pub fn caps(&self) -> Vec<&kernel::Capabilities> {
        self.kernels.iter().map(|k| k.capabilities()).collect()
    }

    /// Draw → recipe (fitted to the kernels) → case.
    pub fn materialize(&self, draw: &Draw) -> (Recipe, Case, Vec<String>) {
        let (recipe, adjust) = draw.resolve(&self.caps());
        let case = recipe.materialize();
        if self.host_values {
            case.kv.materialize();
        }
        (recipe, case, adjust)
    }

    /// The draw of case `k`: its own, with the compile key of its shape epoch's leader
    /// (see `generate::epoch`).
    pub fn draw(&self, k: u64, seed: u64) -> Draw {
        self.in_epoch(k, value_tree(&self.strategy(k), seed).current())
    }

    /// `draw` (of case `k`, or a shrink step of it) with its deployment's server (a
    /// production draw) and its epoch's compile key.
    pub fn in_epoch(&self, k: u64, mut draw: Draw) -> Draw {
        if let (Some(len), Some(_)) = (self.deployments, &draw.engine) {
            epoch::pin_deployment(&mut draw, &self.deployment_leader(len, k));
        }
        if let Some(ep) = &self.epochs {
            if let Some(leader) = self.epoch_leader(ep, k, draw.engine.is_some()) {
                epoch::pin(&mut draw, &leader, &ep.fields);
            }
        }
        draw
    }

    /// The leader of case `k`'s epoch: a draw of the epoch's own seed, of the
    /// production kind or not as asked (the first of a few seeds that gives one).
    fn epoch_leader(&self, ep: &Epochs, k: u64, production: bool) -> Option<Draw> {
        const SALT: u64 = 0x5eed_e90c;
        let e = ep.of(k);
        (0..16u64).find_map(|t| {
            let seed = super::case_seed(self.cfg.seed ^ SALT, (e << 4) | t);
            let d = value_tree(&self.strategy(e * ep.len), seed).current();
            (d.engine.is_some() == production).then_some(d)
        })
    }

    /// The server of case `k`'s deployment: a production draw of the deployment's own
    /// seed.
    fn deployment_leader(&self, len: u64, k: u64) -> Draw {
        const SALT: u64 = 0xde91_0e5e;
        let seed = super::case_seed(self.cfg.seed ^ SALT, k / len);
        value_tree(
            &crate::generate::engine::production(self.scale).sboxed(),
            seed,
        )
        .current()
    }

    /// Generates case `k` from its seed, runs it on every kernel and judges it.
    #[cfg(test)]
    pub fn run_case(&self, k: u64, seed: u64) -> CaseDone {
        self.judge_drawn(self.draw_case(k, seed))
    }

    /// Generates case `k` from its seed.
    #[cfg(test)]
    pub fn draw_case(&self, k: u64, seed: u64) -> Drawn {
        self.draw_case_if(k, seed, |_| true)
            .expect("every recipe is kept")
    }

    /// Generates case `k` from its seed, unless `keep` refuses its recipe (asked before
    /// the case's tensors are made).
    pub fn draw_case_if(
        &self,
        k: u64,
        seed: u64,
        keep: impl FnOnce(&Recipe) -> bool,
    ) -> Option<Drawn> {
        let t0 = Instant::now();
        let draw = self.draw(k, seed);
        let (recipe, adjustments) = draw.resolve(&self.caps());
        if !keep(&recipe) {
            return None;
        }
        let case = recipe.materialize();
        if self.host_values {
            case.kv.materialize();
        }
        Some(Drawn {
            generated: Generated {
                k,
                seed,
                recipe,
                adjustments,
                generate_secs: t0.elapsed().as_secs_f64(),
            },
            case,
        })
    }

    /// Runs a generated case on every kernel and judges it.
    pub fn judge_drawn(&self, drawn: Drawn) -> CaseDone {
        let Drawn { generated, case } = drawn;
        let (recipe, seed) = (&generated.recipe, generated.seed);
        let judgement = match case.validate() {
            // A generator bug: report it loudly as an environment problem of ours.
            Err(e) => Judgement {
                runs: Vec::new(),
                divergence: None,
                environment_error: Some(format!(
                    "internal error: generated case {seed:#x} is invalid: {e}"
                )),
                reference_secs: 0.0,
            },
            Ok(()) => {
                let selection = self.verify_for(recipe).selection(&case, seed);
                let refs = ReferenceCache::with_selection(&case, selection);
                self.judge(&case, refs, true)
            }
        };
        CaseDone {
            generated,
            case,
            judgement,
        }
    }

    /// Runs a corpus case on every kernel and judges it (every row verified).
    pub fn judge_file(&self, case: &Case) -> Judgement {
        self.judge(case, ReferenceCache::new(case), false)
    }

    /// Runs and judges `case` on every kernel; `properties`: with the property checks
    /// the plan in force asks for.
    fn judge(&self, case: &Case, mut refs: ReferenceCache, properties: bool) -> Judgement {
        let mut runs = Vec::new();
        let mut outputs = Vec::new();
        let mut environment_error = None;
        for kern in &self.kernels {
            let j = harness::run_and_judge(kern.as_ref(), case, &mut refs, &self.cfg.oracle);
            let plan = self.property_plan(kern.as_ref());
            let properties = match properties {
                true => {
                    let first = crate::property::FirstRun::of(&j);
                    crate::property::check_case(kern.as_ref(), case, &j.verdict, first, plan)
                }
                false => Vec::new(),
            };
            environment_error = environment_error.or(j.environment_error);
            // A run that crashed on its way to the device judge has nothing to judge.
            let judged_on = match &j.device {
                Some(d) => Ok((d.rechecked, d.cpu_judged)),
                None => harness::judge_site(kern.as_ref(), case, self.cfg.oracle.judge)
                    .map(|()| (0, false)),
            };
            runs.push(KernelRun {
                verdict: j.verdict,
                wall_secs: j.wall.as_secs_f64(),
                setup_secs: j.setup.as_secs_f64(),
                judge_secs: j.judge.as_secs_f64(),
                properties,
                judged_on,
            });
            outputs.push(j.output);
            if environment_error.is_some() {
                break;
            }
        }
        let divergence = if environment_error.is_none() {
            first_divergence(&self.kernels, case, &outputs)
        } else {
            None
        };
        Judgement {
            runs,
            divergence,
            environment_error,
            reference_secs: refs.time.as_secs_f64(),
        }
    }
}

/// The first kernel (index into `kernels`) whose output disagrees with the first
/// kernel's beyond both error bounds, and where (see [`harness::divergence`]). Kernels
/// without an output (skipped, crashed) are not compared.
pub fn first_divergence(
    kernels: &[Box<dyn Kernel>],
    case: &Case,
    outputs: &[Option<kernel::OutputBuffer>],
) -> Option<(usize, String)> {
    let a = outputs.first()?.as_ref()?;
    kernels
        .iter()
        .zip(outputs)
        .enumerate()
        .skip(1)
        .find_map(|(i, (kb, ob))| {
            let b = ob.as_ref()?;
            harness::divergence(case, (kernels[0].as_ref(), a), (kb.as_ref(), b)).map(|m| (i, m))
        })
}

/// The verdict of a divergence: one case-level `divergent` finding saying where.
pub fn divergent_verdict(msg: &str) -> Verdict {
    let mut v = Verdict::default();
    v.add_case_finding(Class::Divergent, msg.to_string());
    v
}

/// The name a divergent finding is filed under: `A vs B`.
pub fn pair_name(a: &str, b: &str) -> String {
    format!("{a} vs {b}")
}

/// Runs `a` and `b` on `case`: where they disagree, if they do, and `b`'s output with
/// its reference (a divergence is pictured on the kernel that disagreed).
pub(super) fn diverges(
    cfg: &OracleConfig,
    a: &dyn Kernel,
    b: &dyn Kernel,
    case: &Case,
) -> (Option<String>, Option<super::book::Evidence>) {
    let mut refs = ReferenceCache::new(case);
    let Some(oa) = harness::run_and_judge(a, case, &mut refs, cfg).output else {
        return (None, None);
    };
    let Some(ob) = harness::run_and_judge(b, case, &mut refs, cfg).output else {
        return (None, None);
    };
    let msg = harness::divergence(case, (a, &oa), (b, &ob));
    let evidence = super::book::Evidence::new(b, ob, refs);
    (msg, Some(evidence))
}
