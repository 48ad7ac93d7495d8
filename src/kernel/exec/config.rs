//! How an [`super::ExecKernel`] starts and supervises its workers: the command, one
//! environment per worker (a GPU each), timeouts, the fork server, the protocol
//! versions offered; from code or from `MQA_FUZZ_EXEC_*` variables.

use super::protocol;
use std::time::Duration;

/// How to start and supervise the workers.
#[derive(Clone, Debug)]
pub struct ExecConfig {
    /// Shell command line of one worker (run with `sh -c`).
    pub command: String,
    /// One entry per worker: extra environment variables (e.g. `CUDA_VISIBLE_DEVICES`).
    /// The pool has `worker_envs.len()` workers (at least one).
    pub worker_envs: Vec<Vec<(String, String)>>,
    /// Longest a case may take, from request to answer.
    pub case_timeout: Duration,
    /// Longest a worker may take to start and send its hello (imports, device init).
    pub handshake_timeout: Duration,
    /// Copy the workers' stderr to ours as it arrives (otherwise only kept for reports).
    pub forward_stderr: bool,
    /// Offer workers to run as fork servers (`MQA_FUZZ_FORK_SERVER=1`; PROTOCOL.md §4).
    pub fork_server: bool,
    /// The protocol versions offered (`MQA_FUZZ_PROTOCOLS`); a worker must pick one.
    pub protocols: Vec<u64>,
    /// With a fork server, fork each next worker life ahead so that a restart finds it
    /// set up (`MQA_FUZZ_EXEC_SPARE=off` turns it off).
    pub spare_lives: bool,
    /// Let a device-judged request wait behind a busy worker (`MQA_FUZZ_PIPELINE=off`
    /// turns it off; see `client::lanes`).
    pub pipeline: bool,
}

impl ExecConfig {
    pub fn new(command: impl Into<String>) -> Self {
        ExecConfig {
            command: command.into(),
            worker_envs: vec![Vec::new()],
            case_timeout: Duration::from_secs(120),
            handshake_timeout: Duration::from_secs(120),
            forward_stderr: false,
            fork_server: true,
            protocols: protocol::SUPPORTED_PROTOCOLS.to_vec(),
            spare_lives: true,
            pipeline: true,
        }
    }

    /// Settings from the environment, for `exec:` names on the command line:
    /// `MQA_FUZZ_EXEC_TIMEOUT` (seconds per case), `MQA_FUZZ_EXEC_HANDSHAKE_TIMEOUT`,
    /// `MQA_FUZZ_EXEC_DEVICES` (`0,1,2,3`: one worker per device, each with
    /// `CUDA_VISIBLE_DEVICES`/`HIP_VISIBLE_DEVICES` set to it), `MQA_FUZZ_EXEC_WORKERS`
    /// (N workers, no device variables) and `MQA_FUZZ_EXEC_STDERR=1`.
    pub fn from_env(command: impl Into<String>) -> Result<Self, String> {
        let mut c = ExecConfig::new(command);
        let secs = |var: &str| -> Result<Option<Duration>, String> {
            match std::env::var(var) {
                Err(_) => Ok(None),
                Ok(v) => match v.trim().parse::<f64>() {
                    Ok(s) if s > 0.0 && s.is_finite() => Ok(Some(Duration::from_secs_f64(s))),
                    _ => Err(format!("{var}={v:?} is not a positive number of seconds")),
                },
            }
        };
        if let Some(t) = secs("MQA_FUZZ_EXEC_TIMEOUT")? {
            c.case_timeout = t;
        }
        if let Some(t) = secs("MQA_FUZZ_EXEC_HANDSHAKE_TIMEOUT")? {
            c.handshake_timeout = t;
        }
        if let Ok(devs) = std::env::var("MQA_FUZZ_EXEC_DEVICES") {
            let devs: Vec<&str> = devs
                .split(',')
                .map(str::trim)
                .filter(|d| !d.is_empty())
                .collect();
            if devs.is_empty() {
                return Err("MQA_FUZZ_EXEC_DEVICES is empty (expected e.g. 0,1,2,3)".into());
            }
            c.worker_envs = devs.iter().map(|d| device_env(d)).collect();
        } else if let Ok(n) = std::env::var("MQA_FUZZ_EXEC_WORKERS") {
            match n.trim().parse::<usize>() {
                Ok(k) if (1..=256).contains(&k) => c.worker_envs = vec![Vec::new(); k],
                _ => {
                    return Err(format!(
                        "MQA_FUZZ_EXEC_WORKERS={n:?} is not a number in 1..=256"
                    ))
                }
            }
        }
        c.forward_stderr = std::env::var("MQA_FUZZ_EXEC_STDERR").is_ok_and(|v| v == "1");
        c.fork_server = !std::env::var("MQA_FUZZ_EXEC_FORK").is_ok_and(|v| v == "0");
        c.protocols = protocol::offered_protocols()?;
        c.spare_lives = switch("MQA_FUZZ_EXEC_SPARE")?.unwrap_or(true);
        c.pipeline = switch("MQA_FUZZ_PIPELINE")?.unwrap_or(true);
        // Read by the workers (they inherit it); a bad value is refused here, once.
        switch(WARM_UP)?;
        Ok(c)
    }
}

/// Workers load what their first case needs before they say hello (`off`: they do not;
/// see [`crate::kernel::Kernel::warm_up`] and `kernels/external/hosted.py`).
pub const WARM_UP: &str = "MQA_FUZZ_WARM_UP";

/// Whether a worker warms up: on unless `MQA_FUZZ_WARM_UP` says off (a bad value was
/// refused by the harness that started it; here it counts as on).
pub fn warm_up_wanted() -> bool {
    !matches!(switch(WARM_UP), Ok(Some(false)))
}

/// An on/off variable: `on`/`1` or `off`/`0` (`None` when unset or empty); anything
/// else is an error naming it, not silently one or the other.
pub fn switch(var: &str) -> Result<Option<bool>, String> {
    parse_switch(var, std::env::var(var).ok().as_deref())
}

fn parse_switch(var: &str, value: Option<&str>) -> Result<Option<bool>, String> {
    match value.map(|v| v.trim().to_ascii_lowercase()).as_deref() {
        None | Some("") => Ok(None),
        Some("on" | "1") => Ok(Some(true)),
        Some("off" | "0") => Ok(Some(false)),
        Some(_) => Err(format!(
            "{var}={:?}: use on or off",
            value.unwrap_or_default()
        )),
    }
}

/// The device a worker of a pool is pinned to, as [`device_env`] names it to the worker
/// (and the pool counts workers sharing one by it).
pub const WORKER_DEVICE: &str = "MQA_FUZZ_WORKER_DEVICE";

/// The environment that pins a worker to one GPU, NVIDIA or AMD.
pub fn device_env(device: &str) -> Vec<(String, String)> {
    vec![
        ("CUDA_VISIBLE_DEVICES".into(), device.into()),
        ("HIP_VISIBLE_DEVICES".into(), device.into()),
        (WORKER_DEVICE.into(), device.into()),
    ]
}

#[cfg(test)]
mod tests {
    use super::parse_switch;

    #[test]
    fn switches_take_on_and_off_and_refuse_the_rest() {
        assert_eq!(parse_switch("X", None), Ok(None));
        assert_eq!(parse_switch("X", Some("")), Ok(None));
        assert_eq!(parse_switch("X", Some("on")), Ok(Some(true)));
        assert_eq!(parse_switch("X", Some(" OFF ")), Ok(Some(false)));
        assert_eq!(parse_switch("X", Some("0")), Ok(Some(false)));
        assert_eq!(parse_switch("X", Some("1")), Ok(Some(true)));
        let e = parse_switch("MQA_FUZZ_PIPELINE", Some("yes")).unwrap_err();
        assert!(e.contains("MQA_FUZZ_PIPELINE=\"yes\""), "{e}");
    }
}
