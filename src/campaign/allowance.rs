//! How long the finding book may shrink. Shrinking (shrink steps and ablation) runs on
//! the main thread while the workers keep generating, and on a slow kernel (a GPU
//! library behind the worker protocol, a crash that restarts the worker) one finding
//! can eat the campaign. So it has three caps: each finding at most `--shrink-budget`;
//! all findings together at most `--shrink-share` of the wall budget; nothing past the
//! budget's end. A finding met once the share is spent or the budget nearly over still
//! gets a floor ([`floor`]: min(5 s, `--shrink-budget`)), drawn from one pool of that
//! size for the whole campaign, so shrinking overruns the share, and the campaign its
//! budget, by at most one floor (plus the step in flight when a cap is reached).

use super::Config;
use crate::report::{ShrinkCut, Shrinking};
use std::time::{Duration, Instant};

/// The most a late finding is shrunk for once a campaign cap is reached.
pub const FLOOR: Duration = Duration::from_secs(5);

/// The floor of a campaign: [`FLOOR`], or the per-finding budget when that is smaller.
pub fn floor(cfg: &Config) -> Duration {
    FLOOR.min(cfg.shrink_budget)
}

/// The campaign's shrink clock: what has been spent, what is left.
pub(super) struct Allowance {
    per_finding: Duration,
    /// share × budget; `None` without a wall budget.
    cap: Option<Duration>,
    deadline: Option<Instant>,
    floor: Duration,
    spent: Duration,
    /// Shrink time spent after the deadline.
    past_deadline: Duration,
    /// The guess of a shrink step's or ablation run's time, learnt from the last one, so
    /// that a run expected to end past its grant is not started (a step on a large case
    /// takes seconds; each finding's first step would overrun the caps by one).
    pub run_cost: crate::finding::RunCost,
    pub summary: Shrinking,
}

/// What one finding may use.
#[derive(Clone, Copy, Debug)]
pub(super) struct Grant {
    pub budget: Duration,
    /// The cap that held the grant below the per-finding budget, if one did.
    pub limit: Option<ShrinkCut>,
    started: Instant,
}

impl Grant {
    /// When the grant runs out.
    pub fn end(&self) -> Instant {
        self.started + self.budget
    }
}

impl Allowance {
    pub fn new(cfg: &Config, deadline: Option<Instant>) -> Allowance {
        let cap = cfg.budget.map(|b| b.mul_f64(cfg.shrink_share));
        Allowance {
            per_finding: cfg.shrink_budget,
            cap,
            deadline,
            floor: floor(cfg),
            spent: Duration::ZERO,
            past_deadline: Duration::ZERO,
            run_cost: Default::default(),
            summary: Shrinking {
                share: cfg.shrink_share,
                cap_secs: cap.map_or(0.0, |c| c.as_secs_f64()),
                per_finding_secs: cfg.shrink_budget.as_secs_f64(),
                floor_secs: floor(cfg).as_secs_f64(),
                ..Default::default()
            },
        }
    }

    /// How much of the floor's pool is left: what shrinking has not yet used beyond
    /// the share, nor after the deadline.
    fn floor_left(&self) -> Duration {
        let over_share = self
            .cap
            .map_or(Duration::ZERO, |c| self.spent.saturating_sub(c));
        self.floor
            .saturating_sub(over_share.max(self.past_deadline))
    }

    /// What a finding met now may use. `deadline`: whether the budget's end applies
    /// (replaying the corpus goes on past it, as it always has).
    pub fn grant(&self, deadline: bool) -> Grant {
        let now = Instant::now();
        let mut regular = self.per_finding;
        let mut limit = None;
        if let Some(left) = self.cap.map(|c| c.saturating_sub(self.spent)) {
            if left < regular {
                (regular, limit) = (left, Some(ShrinkCut::ShareSpent));
            }
        }
        if let Some(left) = self.deadline.filter(|_| deadline).map(|d| d - now.min(d)) {
            if left < regular {
                (regular, limit) = (left, Some(ShrinkCut::BudgetEnd));
            }
        }
        let topup = self
            .floor
            .min(self.per_finding)
            .saturating_sub(regular)
            .min(self.floor_left());
        Grant {
            budget: regular + topup,
            limit,
            started: now,
        }
    }

    /// Charges the time used since `grant` was made; `out_of_time`: shrinking or
    /// ablation stopped because the grant ran out. Returns why it was cut short, when a
    /// campaign cap (not the per-finding budget) had set the grant.
    pub fn charge(&mut self, grant: &Grant, out_of_time: bool) -> Option<ShrinkCut> {
        let now = Instant::now();
        self.spent += now - grant.started;
        if let Some(d) = self.deadline {
            self.past_deadline += now.saturating_duration_since(d.max(grant.started));
        }
        let cut = grant.limit.filter(|_| out_of_time);
        match cut {
            Some(ShrinkCut::ShareSpent) => self.summary.cut_short_share += 1,
            Some(ShrinkCut::BudgetEnd) => self.summary.cut_short_budget_end += 1,
            None => {}
        }
        cut
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(budget: u64, share: f64, per: u64) -> Config {
        let mut c = Config::new(vec![], "r".into());
        c.budget = Some(Duration::from_secs(budget));
        c.shrink_share = share;
        c.shrink_budget = Duration::from_secs(per);
        c
    }

    /// Spends `secs` of a grant without sleeping: the grant is backdated.
    fn spend(a: &mut Allowance, g: Grant, secs: u64) -> Option<ShrinkCut> {
        let g = Grant {
            started: g.started - Duration::from_secs(secs),
            ..g
        };
        a.charge(&g, true)
    }

    fn secs(g: &Grant) -> f64 {
        (g.budget.as_secs_f64() * 100.0).round() / 100.0
    }

    #[test]
    fn the_share_caps_the_total_and_one_floor_is_shared_by_late_findings() {
        let c = cfg(100, 0.3, 20);
        let mut a = Allowance::new(&c, Some(Instant::now() + Duration::from_secs(100)));
        let g = a.grant(true);
        assert_eq!((secs(&g), g.limit), (20.0, None));
        assert_eq!(spend(&mut a, g, 20), None, "the per-finding cap is no cut");
        let g = a.grant(true);
        assert_eq!((secs(&g), g.limit), (10.0, Some(ShrinkCut::ShareSpent)));
        assert_eq!(spend(&mut a, g, 10), Some(ShrinkCut::ShareSpent));
        // The share is spent: the next finding gets the floor, the one after nothing.
        let g = a.grant(true);
        assert_eq!(secs(&g), FLOOR.as_secs_f64());
        spend(&mut a, g, 5);
        assert_eq!(a.grant(true).budget, Duration::ZERO);
        assert_eq!(a.summary.cut_short_share, 2);
    }

    #[test]
    fn the_budget_end_cuts_and_the_floor_is_at_most_the_per_finding_budget() {
        let c = cfg(100, 1.0, 3);
        let a = Allowance::new(&c, Some(Instant::now() + Duration::from_secs(1)));
        let g = a.grant(true);
        assert_eq!(g.limit, Some(ShrinkCut::BudgetEnd));
        assert_eq!(
            g.budget,
            Duration::from_secs(3),
            "topped up to the floor, 3 s"
        );
        // The corpus replay is not held to the deadline.
        assert_eq!(a.grant(false).limit, None);
    }
}
