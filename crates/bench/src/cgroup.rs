//! A CPU cap for the proxy under test: a cgroup with a CFS quota (v1 `cpu` or v2 `cpu.max`) that the proxy's command joins before it runs, and its throttling counts.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The cgroups this process made and has not removed yet (for [`remove_all`] on an interrupt,
/// which exits without running destructors).
static MADE: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// The scheduler period of the cap (the quota is a share of it).
pub const PERIOD_US: u64 = 100_000;

/// The cgroup interface a mount offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    /// A v1 hierarchy with the `cpu` controller: `cpu.cfs_quota_us`, `cpu.cfs_period_us`.
    V1,
    /// The unified hierarchy: `cpu.max`.
    V2,
}

/// A cgroup made for the run, removed when dropped (it must be empty by then: the proxies it
/// held are stopped first).
#[derive(Debug)]
pub struct CpuCap {
    pub dir: PathBuf,
    pub version: Version,
    /// Percent of one CPU (50 = half a core; 200 = two cores).
    pub percent: f64,
}

/// The throttling counters of `cpu.stat`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Throttling {
    /// Periods in which the group ran.
    pub periods: u64,
    /// Periods in which it used its whole quota and waited.
    pub throttled: u64,
    /// Time spent waiting, in microseconds.
    pub throttled_us: u64,
}

impl Throttling {
    /// The counters accrued since `before`.
    pub fn since(self, before: Throttling) -> Throttling {
        Throttling {
            periods: self.periods.saturating_sub(before.periods),
            throttled: self.throttled.saturating_sub(before.throttled),
            throttled_us: self.throttled_us.saturating_sub(before.throttled_us),
        }
    }

    /// One line for the terminal and the report.
    pub fn text(&self) -> String {
        let share = if self.periods == 0 {
            0.0
        } else {
            100.0 * self.throttled as f64 / self.periods as f64
        };
        format!(
            "throttled in {} of {} periods ({share:.0}%), {:.1} s waiting",
            self.throttled,
            self.periods,
            self.throttled_us as f64 / 1e6
        )
    }
}

/// Where a cgroup with the `cpu` controller can be made, from `/proc/mounts` text and a test of
/// which controllers a v2 mount offers: a v1 hierarchy with `cpu` first (when it exists, v2 has
/// no `cpu`), else a v2 mount whose `cgroup.controllers` lists it.
pub fn find_mount(mounts: &str, v2_has_cpu: impl Fn(&Path) -> bool) -> Option<(PathBuf, Version)> {
    let entries: Vec<(&str, &str, &str)> = mounts
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (_, at, kind, opts) = (f.next()?, f.next()?, f.next()?, f.next()?);
            Some((at, kind, opts))
        })
        .collect();
    let v1 = entries
        .iter()
        .find(|(_, kind, opts)| *kind == "cgroup" && opts.split(',').any(|o| o == "cpu"));
    if let Some((at, _, _)) = v1 {
        return Some((PathBuf::from(at), Version::V1));
    }
    entries
        .iter()
        .filter(|(_, kind, _)| *kind == "cgroup2")
        .map(|(at, _, _)| PathBuf::from(at))
        .find(|at| v2_has_cpu(at))
        .map(|at| (at, Version::V2))
}

/// The files and values that set a quota of `percent` of a CPU.
pub fn quota_files(version: Version, percent: f64) -> Vec<(&'static str, String)> {
    let quota = ((percent / 100.0) * PERIOD_US as f64).round().max(1000.0) as u64;
    match version {
        Version::V1 => vec![
            ("cpu.cfs_period_us", PERIOD_US.to_string()),
            ("cpu.cfs_quota_us", quota.to_string()),
        ],
        Version::V2 => vec![("cpu.max", format!("{quota} {PERIOD_US}"))],
    }
}

/// The throttling counters in `cpu.stat` text (v1 counts waiting in ns, v2 in µs).
pub fn parse_stat(text: &str) -> Throttling {
    let mut t = Throttling::default();
    for line in text.lines() {
        let Some((k, v)) = line.split_once(' ') else {
            continue;
        };
        let Ok(v) = v.trim().parse::<u64>() else {
            continue;
        };
        match k {
            "nr_periods" => t.periods = v,
            "nr_throttled" => t.throttled = v,
            "throttled_time" => t.throttled_us = v / 1000,
            "throttled_usec" => t.throttled_us = v,
            _ => {}
        }
    }
    t
}

impl CpuCap {
    /// Make the cgroup `name` with a quota of `percent` of one CPU.
    pub fn create(name: &str, percent: f64) -> Result<CpuCap, String> {
        if !(percent.is_finite() && percent >= 1.0) {
            return Err(format!(
                "a CPU cap of {percent}%: must be at least 1 (percent of one CPU)"
            ));
        }
        let mounts = std::fs::read_to_string("/proc/mounts")
            .map_err(|e| format!("cannot read /proc/mounts: {e}"))?;
        let (root, version) = find_mount(&mounts, |at| {
            std::fs::read_to_string(at.join("cgroup.controllers"))
                .is_ok_and(|c| c.split_whitespace().any(|w| w == "cpu"))
        })
        .ok_or("no cgroup hierarchy with the cpu controller is mounted")?;
        if version == Version::V2 {
            // The controller must be on for the root's children.
            let control = root.join("cgroup.subtree_control");
            let on = std::fs::read_to_string(&control)
                .is_ok_and(|c| c.split_whitespace().any(|w| w == "cpu"));
            if !on {
                std::fs::write(&control, "+cpu")
                    .map_err(|e| format!("cannot enable cpu in {}: {e}", control.display()))?;
            }
        }
        let dir = root.join(name);
        match std::fs::create_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(format!("cannot make the cgroup {}: {e}", dir.display())),
        }
        if let Ok(mut made) = MADE.lock() {
            made.push(dir.clone());
        }
        let cap = CpuCap {
            dir,
            version,
            percent,
        };
        for (file, value) in quota_files(version, percent) {
            let p = cap.dir.join(file);
            std::fs::write(&p, &value)
                .map_err(|e| format!("cannot write {value} to {}: {e}", p.display()))?;
        }
        Ok(cap)
    }

    /// `cmd` run so that its process joins the cgroup before the program starts (a shell
    /// writes its own pid, then execs: the pid stays, and every process the program forks or
    /// thread it starts is inside).
    pub fn wrap(&self, cmd: &[String]) -> Vec<String> {
        let procs = self.dir.join("cgroup.procs");
        [
            "sh".to_string(),
            "-c".into(),
            "echo $$ > \"$0\" && exec \"$@\"".into(),
            procs.display().to_string(),
        ]
        .into_iter()
        .chain(cmd.iter().cloned())
        .collect()
    }

    /// Its throttling counters now.
    pub fn throttling(&self) -> Throttling {
        std::fs::read_to_string(self.dir.join("cpu.stat"))
            .map(|t| parse_stat(&t))
            .unwrap_or_default()
    }

    /// How the cap was set, for the report.
    pub fn describe(&self) -> String {
        let files = quota_files(self.version, self.percent)
            .into_iter()
            .map(|(f, v)| format!("{f} {v}"))
            .collect::<Vec<_>>()
            .join(", ");
        format!(
            "the proxy capped to {}% of one CPU by a cgroup ({}, {files})",
            self.percent,
            match self.version {
                Version::V1 => "v1",
                Version::V2 => "v2",
            }
        )
    }
}

/// Remove a cgroup this process made, once the processes in it are gone: the kernel refuses
/// while a killed one is still exiting, so for up to a second; a cgroup left is reported.
fn remove(dir: &Path) {
    let end = Instant::now() + Duration::from_secs(1);
    loop {
        match std::fs::remove_dir(dir) {
            Ok(()) => break,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
            Err(e) if Instant::now() >= end => {
                eprintln!("bench compare: the cgroup {} is left: {e}", dir.display());
                break;
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
    if let Ok(mut made) = MADE.lock() {
        made.retain(|d| d != dir);
    }
}

/// Remove every cgroup this process made (on an interrupt, after its processes were stopped).
pub fn remove_all() {
    let dirs = MADE.lock().map(|m| m.clone()).unwrap_or_default();
    for d in dirs {
        remove(&d);
    }
}

impl Drop for CpuCap {
    fn drop(&mut self) {
        remove(&self.dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const V1_AND_V2: &str = "\
tmpfs /sys/fs/cgroup tmpfs rw,relatime,mode=755 0 0
cgroup /sys/fs/cgroup/cpuacct cgroup rw,relatime,cpuacct 0 0
cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,nosuid,cpu,cpuacct 0 0
cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0
";

    #[test]
    fn the_v1_cpu_hierarchy_comes_first() {
        assert_eq!(
            find_mount(V1_AND_V2, |_| true),
            Some((PathBuf::from("/sys/fs/cgroup/cpu,cpuacct"), Version::V1))
        );
        // cpuacct alone is not cpu
        let only_acct = V1_AND_V2.replace("rw,nosuid,cpu,cpuacct", "rw,cpuacct");
        assert_eq!(
            find_mount(&only_acct, |p| p == Path::new("/sys/fs/cgroup/unified")),
            Some((PathBuf::from("/sys/fs/cgroup/unified"), Version::V2))
        );
        assert_eq!(find_mount(&only_acct, |_| false), None);
    }

    #[test]
    fn quotas_are_shares_of_the_period() {
        assert_eq!(
            quota_files(Version::V1, 50.0),
            vec![
                ("cpu.cfs_period_us", "100000".to_string()),
                ("cpu.cfs_quota_us", "50000".to_string())
            ]
        );
        assert_eq!(
            quota_files(Version::V2, 150.0),
            vec![("cpu.max", "150000 100000".to_string())]
        );
    }

    #[test]
    fn throttling_from_either_version() {
        let v1 = "nr_periods 200\nnr_throttled 50\nthrottled_time 2500000000\nnr_bursts 0\n";
        let v2 = "usage_usec 9\nnr_periods 200\nnr_throttled 50\nthrottled_usec 2500000\n";
        let want = Throttling {
            periods: 200,
            throttled: 50,
            throttled_us: 2_500_000,
        };
        assert_eq!(parse_stat(v1), want);
        assert_eq!(parse_stat(v2), want);
        let later = Throttling {
            periods: 300,
            throttled: 60,
            throttled_us: 3_000_000,
        };
        assert_eq!(
            later.since(want).text(),
            "throttled in 10 of 100 periods (10%), 0.5 s waiting"
        );
    }

    #[test]
    fn the_wrapped_command_joins_then_runs_the_program() {
        let dir = std::env::temp_dir().join(format!("portico-cap-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cap = CpuCap {
            dir,
            version: Version::V1,
            percent: 50.0,
        };
        let cmd = cap.wrap(&["sh".into(), "-c".into(), "echo ran $$".into()]);
        let out = std::process::Command::new(&cmd[0])
            .args(&cmd[1..])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let ran = String::from_utf8_lossy(&out.stdout);
        let joined = std::fs::read_to_string(cap.dir.join("cgroup.procs")).unwrap();
        // the pid written is the program's own: exec kept it
        assert_eq!(ran.trim(), format!("ran {}", joined.trim()));
        std::fs::remove_file(cap.dir.join("cgroup.procs")).unwrap();
        // dropping removes the (now empty) directory
        let dir = cap.dir.clone();
        drop(cap);
        assert!(!dir.exists());
    }
}
