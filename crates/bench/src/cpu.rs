//! CPU time (user + system) of process trees, read from /proc.

use crate::error::BenchError;
use std::collections::{BTreeSet, HashMap};

/// Clock ticks per second of /proc times: USER_HZ, fixed at 100 in the Linux ABI.
pub const TICKS_PER_SECOND: u64 = 100;

/// The fields of `/proc/PID/stat` this module needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    pub pid: u32,
    pub ppid: u32,
    /// utime + stime of the process (all its threads), ticks.
    pub own: u64,
    /// cutime + cstime: children it has waited for, ticks.
    pub children: u64,
}

/// Parse one `/proc/PID/stat` line. The command name may hold spaces and parentheses, so the
/// fields are counted after the last `)`.
pub fn parse_stat(text: &str) -> Option<Stat> {
    let (head, tail) = text.rsplit_once(')')?;
    let pid = head.split_once('(')?.0.trim().parse().ok()?;
    // After ")": state(3) ppid(4) ... utime(14) stime(15) cutime(16) cstime(17).
    let f: Vec<&str> = tail.split_whitespace().collect();
    let num = |i: usize| f.get(i).and_then(|s| s.parse::<u64>().ok());
    let cnum = |i: usize| {
        f.get(i)
            .and_then(|s| s.parse::<i64>().ok())
            .map(|v| v.max(0) as u64)
    };
    Some(Stat {
        pid,
        ppid: u32::try_from(num(1)?).ok()?,
        own: num(11)?.saturating_add(num(12)?),
        children: cnum(13)?.saturating_add(cnum(14)?),
    })
}

fn read_stat(pid: u32) -> Option<Stat> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// All processes now, by pid.
fn all_processes() -> Vec<Stat> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(read_stat)
        .collect()
}

/// The pids of `roots` and all their descendants among `procs`.
pub fn tree(procs: &[Stat], roots: &[u32]) -> BTreeSet<u32> {
    let mut kids: HashMap<u32, Vec<u32>> = HashMap::new();
    for p in procs {
        kids.entry(p.ppid).or_default().push(p.pid);
    }
    let mut out = BTreeSet::new();
    let mut stack: Vec<u32> = roots
        .iter()
        .copied()
        .filter(|r| procs.iter().any(|p| p.pid == *r))
        .collect();
    while let Some(pid) = stack.pop() {
        if out.insert(pid) {
            if let Some(k) = kids.get(&pid) {
                stack.extend(k);
            }
        }
    }
    out
}

/// CPU time of a set of process trees at one instant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeSample {
    /// Sum over the trees of utime + stime + cutime + cstime, ticks: a child that exits and is
    /// reaped during the run moves from its own times to its parent's children times, so the
    /// difference of two samples still counts it.
    pub ticks: u64,
    /// Processes in the trees.
    pub processes: usize,
}

/// Sample the trees rooted at `roots`. Every root must exist.
pub fn sample_trees(roots: &[u32]) -> Result<TreeSample, BenchError> {
    let procs = all_processes();
    for r in roots {
        if !procs.iter().any(|p| p.pid == *r) {
            return Err(BenchError::Cpu {
                pid: *r,
                reason: "no such process".to_string(),
            });
        }
    }
    let pids = tree(&procs, roots);
    let ticks = procs
        .iter()
        .filter(|p| pids.contains(&p.pid))
        .map(|p| p.own.saturating_add(p.children))
        .sum();
    Ok(TreeSample {
        ticks,
        processes: pids.len(),
    })
}

/// `root` and all its descendants now (empty when `root` is gone).
pub fn descendants(root: u32) -> BTreeSet<u32> {
    tree(&all_processes(), &[root])
}

/// utime + stime of this process (all threads), ticks.
pub fn sample_self() -> Option<u64> {
    parse_stat(&std::fs::read_to_string("/proc/self/stat").ok()?).map(|s| s.own)
}

/// Ticks to seconds.
pub fn seconds(ticks: u64) -> f64 {
    ticks as f64 / TICKS_PER_SECOND as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stat_with_odd_command_names() {
        let line = "4242 (my (odd) prog) S 1 4242 4242 0 -1 4194560 100 0 0 0 \
                    250 75 3 -1 20 0 4 0 12345 1000000 200 18446744073709551615";
        let s = parse_stat(line).unwrap();
        assert_eq!(
            s,
            Stat {
                pid: 4242,
                ppid: 1,
                own: 325,
                children: 3
            }
        );
        assert!(parse_stat("garbage").is_none());
        assert!(parse_stat("1 (x) S").is_none());
    }

    #[test]
    fn trees_include_descendants_only() {
        let p = |pid, ppid| Stat {
            pid,
            ppid,
            own: 1,
            children: 0,
        };
        let procs = [p(1, 0), p(10, 1), p(11, 10), p(12, 11), p(20, 1), p(13, 10)];
        assert_eq!(
            tree(&procs, &[10]).into_iter().collect::<Vec<_>>(),
            [10, 11, 12, 13]
        );
        assert_eq!(tree(&procs, &[12, 20]).len(), 2);
        assert!(tree(&procs, &[99]).is_empty());
    }

    #[test]
    fn samples_this_process() {
        let me = std::process::id();
        let s = sample_trees(&[me]).unwrap();
        assert!(s.processes >= 1);
        assert!(sample_self().is_some());
        assert!(sample_trees(&[u32::MAX]).is_err());
    }
}
