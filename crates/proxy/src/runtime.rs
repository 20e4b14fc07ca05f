//! Changes made through the admin API (servers added and removed, drain and disable, weights): applied over every configuration a reload brings, and kept in the state file across restarts.

use portico_config::{Config, Server, UpstreamGroup};
use portico_upstream::{AdminState, Upstream};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The state the API set on a server (enabled is no change).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Held {
    Draining,
    Disabled,
}

/// One group's changes.
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GroupChanges {
    /// Servers added, with their weights.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub added: BTreeMap<SocketAddr, u32>,
    /// Servers removed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub removed: Vec<SocketAddr>,
    /// Servers drained or disabled.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub state: BTreeMap<SocketAddr, Held>,
    /// Weights set.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub weight: BTreeMap<SocketAddr, u32>,
}

impl GroupChanges {
    fn is_empty(&self) -> bool {
        self.added.is_empty()
            && self.removed.is_empty()
            && self.state.is_empty()
            && self.weight.is_empty()
    }
}

/// Largest weight a server may have (as the configuration and the API accept).
const MAX_WEIGHT: u32 = 1000;

/// Why the state file could not be loaded.
#[derive(Debug)]
pub struct LoadError {
    pub message: String,
    /// The file is not a state file (it may be set aside); otherwise it could not be read.
    pub corrupt: bool,
}

/// The admin API's changes by group name, and where they are kept.
#[derive(Debug, Default, Clone)]
pub struct Changes {
    pub groups: BTreeMap<String, GroupChanges>,
    file: Option<PathBuf>,
}

/// The state file's form.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct StateFile {
    version: u32,
    groups: BTreeMap<String, GroupChanges>,
}

impl Changes {
    /// The changes kept in `file` (none when it does not exist yet). A file that cannot be
    /// read or is not a state file is an error, which says whether the file is corrupt (and
    /// may be set aside) or only unreadable now.
    pub fn load(file: Option<&Path>) -> Result<Changes, LoadError> {
        let mut c = Changes {
            groups: BTreeMap::new(),
            file: file.map(Path::to_path_buf),
        };
        let Some(path) = file else { return Ok(c) };
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(c),
            Err(e) => {
                return Err(LoadError {
                    message: format!("state file {}: {e}", path.display()),
                    corrupt: false,
                })
            }
        };
        let corrupt = |why: String| LoadError {
            message: format!("state file {}: {why}", path.display()),
            corrupt: true,
        };
        let state: StateFile = serde_json::from_str(&text).map_err(|e| corrupt(e.to_string()))?;
        if state.version != 1 {
            return Err(corrupt(format!(
                "version {} is not one this Portico reads (1)",
                state.version
            )));
        }
        for (name, g) in &state.groups {
            let weights = g.added.values().chain(g.weight.values());
            if let Some(w) = weights.into_iter().find(|w| !(1..=MAX_WEIGHT).contains(*w)) {
                return Err(corrupt(format!(
                    "group {name:?}: weight {w} is not from 1 to {MAX_WEIGHT}"
                )));
            }
        }
        c.groups = state.groups;
        Ok(c)
    }

    /// Write the changes to the state file, if there is one (a temporary file renamed over
    /// it, so a crash leaves the old or the new file, never half of one).
    pub fn save(&self) -> Result<(), String> {
        let Some(path) = &self.file else {
            return Ok(());
        };
        let state = StateFile {
            version: 1,
            groups: self.groups.clone(),
        };
        let mut text = serde_json::to_string_pretty(&state).map_err(|e| e.to_string())?;
        text.push('\n');
        let tmp = with_suffix(path, ".tmp");
        let written = std::fs::File::create(&tmp).and_then(|mut f| {
            use std::io::Write;
            f.write_all(text.as_bytes())?;
            // On disk before the rename: a power cut leaves the old file or the new one.
            f.sync_all()
        });
        written
            .and_then(|()| std::fs::rename(&tmp, path))
            .map_err(|e| format!("state file {}: {e}", path.display()))
    }

    /// No changes yet; they are saved to `file` from the first one on.
    pub fn empty(file: Option<&Path>) -> Changes {
        Changes {
            groups: BTreeMap::new(),
            file: file.map(Path::to_path_buf),
        }
    }

    pub fn file(&self) -> Option<&Path> {
        self.file.as_deref()
    }

    fn group(&mut self, name: &str) -> &mut GroupChanges {
        self.groups.entry(name.to_string()).or_default()
    }

    fn tidy(&mut self, group: &str) {
        if self.groups.get(group).is_some_and(GroupChanges::is_empty) {
            self.groups.remove(group);
        }
    }

    pub fn record_added(&mut self, group: &str, address: SocketAddr, weight: u32) {
        let g = self.group(group);
        g.removed.retain(|a| *a != address);
        g.added.insert(address, weight);
    }

    pub fn record_removed(&mut self, group: &str, address: SocketAddr) {
        let g = self.group(group);
        // A server added here and removed again leaves no trace.
        if g.added.remove(&address).is_none() && !g.removed.contains(&address) {
            g.removed.push(address);
        }
        g.state.remove(&address);
        g.weight.remove(&address);
        self.tidy(group);
    }

    pub fn record_state(&mut self, group: &str, address: SocketAddr, state: AdminState) {
        let g = self.group(group);
        match state {
            AdminState::Enabled => g.state.remove(&address),
            AdminState::Draining => g.state.insert(address, Held::Draining),
            AdminState::Disabled => g.state.insert(address, Held::Disabled),
        };
        self.tidy(group);
    }

    /// A weight set; `configured` is the configuration's (setting it back forgets the change).
    pub fn record_weight(
        &mut self,
        group: &str,
        address: SocketAddr,
        weight: u32,
        configured: u32,
    ) {
        let g = self.group(group);
        if let Some(w) = g.added.get_mut(&address) {
            *w = weight;
        } else if weight == configured {
            g.weight.remove(&address);
        } else {
            g.weight.insert(address, weight);
        }
        self.tidy(group);
    }

    /// Apply the server lists' changes to `config` (about to be applied): servers added where
    /// missing, removed where present (never a group's last). Changes for groups the
    /// configuration no longer has, and states and weights of servers it no longer has, are
    /// forgotten: one warning each. In a group with a `discovery`, the changes of servers it
    /// does not list are kept: DNS may give them (now or later), and the caller leaves the
    /// removed ones out.
    pub fn apply_to(&mut self, config: &mut Config) -> Vec<String> {
        let mut warnings = Vec::new();
        let mut gone = Vec::new();
        for (name, changes) in &mut self.groups {
            let Some(slot) = config.upstreams.iter_mut().find(|g| &g.name == name) else {
                warnings.push(format!(
                    "runtime changes to group {name:?} dropped: the configuration no longer has the group ({})",
                    describe(changes)
                ));
                gone.push(name.clone());
                continue;
            };
            let mut g: UpstreamGroup = (**slot).clone();
            let discovers = g.discovery.is_some();
            // A server the file now lists is the file's: an added one's weight stays as a
            // weight change when it differs; a removed one the file no longer lists is gone.
            let mut weights = Vec::new();
            changes.added.retain(|address, weight| {
                match g.servers.iter().find(|s| s.address == *address) {
                    Some(s) => {
                        if s.weight != *weight {
                            weights.push((*address, *weight));
                        }
                        false
                    }
                    None => true,
                }
            });
            changes.weight.extend(weights);
            changes
                .removed
                .retain(|a| discovers || g.servers.iter().any(|s| s.address == *a));
            for (&address, &weight) in &changes.added {
                g.servers.push(Server { address, weight });
            }
            for address in &changes.removed {
                if !g.servers.iter().any(|s| s.address == *address) {
                    continue;
                }
                if g.servers.len() > 1 {
                    g.servers.retain(|s| s.address != *address);
                } else {
                    warnings.push(format!(
                        "runtime removal of server {address} from group {name:?} not applied: it is the group's last server"
                    ));
                }
            }
            let has = |a: &SocketAddr| discovers || g.servers.iter().any(|s| s.address == *a);
            for (what, list) in [
                (
                    "drain/disable",
                    changes.state.keys().copied().collect::<Vec<_>>(),
                ),
                ("weight", changes.weight.keys().copied().collect()),
            ] {
                for a in list.iter().filter(|a| !has(a)) {
                    warnings.push(format!(
                        "runtime {what} of server {a} in group {name:?} dropped: the group no longer has that server"
                    ));
                }
            }
            changes.state.retain(|a, _| has(a));
            changes.weight.retain(|a, _| has(a));
            *slot = Arc::new(g);
        }
        for name in gone {
            self.groups.remove(&name);
        }
        warnings
    }

    /// Set the states and weights on the groups of a snapshot just published.
    pub fn apply_states(&self, upstreams: &[Arc<Upstream>]) {
        let now = std::time::Instant::now();
        for u in upstreams {
            let Some(changes) = self.groups.get(&u.group().name) else {
                continue;
            };
            for (i, s) in u.group().servers.iter().enumerate() {
                match changes.state.get(&s.address) {
                    Some(Held::Draining) => u.set_admin_at(i, AdminState::Draining, now),
                    Some(Held::Disabled) => u.set_admin_at(i, AdminState::Disabled, now),
                    None => true,
                };
                if let Some(&w) = changes.weight.get(&s.address) {
                    u.set_weight(i, w);
                }
            }
        }
    }
}

/// `path` with `suffix` appended to its file name (`state.json` -> `state.json.tmp`).
pub fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

fn describe(c: &GroupChanges) -> String {
    let mut parts = Vec::new();
    if !c.added.is_empty() {
        parts.push(format!("{} server(s) added", c.added.len()));
    }
    if !c.removed.is_empty() {
        parts.push(format!("{} removed", c.removed.len()));
    }
    if !c.state.is_empty() {
        parts.push(format!("{} drained or disabled", c.state.len()));
    }
    if !c.weight.is_empty() {
        parts.push(format!("{} weight(s) set", c.weight.len()));
    }
    parts.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(servers: &str) -> Config {
        portico_config::parse(
            &format!(
                "[[listeners]]\naddress = \"127.0.0.1:1\"\n[[listeners.routes]]\nproxy = \"b\"\n[upstreams.b]\nservers = [{servers}]\n"
            ),
            "t.toml",
        )
        .unwrap()
    }

    fn addrs(c: &Config) -> Vec<String> {
        c.upstreams[0]
            .servers
            .iter()
            .map(|s| format!("{}*{}", s.address, s.weight))
            .collect()
    }

    #[test]
    fn changes_apply_over_a_new_configuration_and_forget_what_it_lost() {
        let a: SocketAddr = "10.0.0.1:80".parse().unwrap();
        let b: SocketAddr = "10.0.0.2:80".parse().unwrap();
        let c: SocketAddr = "10.0.0.3:80".parse().unwrap();
        let mut ch = Changes::default();
        ch.record_added("b", c, 3);
        ch.record_removed("b", a);
        ch.record_state("b", b, AdminState::Draining);
        ch.record_weight("b", b, 7, 1);
        let mut cfg = config("\"10.0.0.1:80\", \"10.0.0.2:80\"");
        assert!(ch.apply_to(&mut cfg).is_empty());
        assert_eq!(addrs(&cfg), ["10.0.0.2:80*1", "10.0.0.3:80*3"]);
        // The same file again (a reload): the same result, the changes kept.
        let mut cfg = config("\"10.0.0.1:80\", \"10.0.0.2:80\"");
        assert!(ch.apply_to(&mut cfg).is_empty());
        assert_eq!(addrs(&cfg), ["10.0.0.2:80*1", "10.0.0.3:80*3"]);
        assert_eq!(ch.groups["b"].added.len(), 1);
        assert_eq!(ch.groups["b"].removed, [a]);
        // The file drops server b: its state and weight are forgotten, with a warning each.
        let mut cfg = config("\"10.0.0.1:80\", \"10.0.0.4:80\"");
        let w = ch.apply_to(&mut cfg);
        assert_eq!(w.len(), 2, "{w:?}");
        assert!(w[0].contains("10.0.0.2:80"), "{w:?}");
        assert!(ch.groups["b"].state.is_empty() && ch.groups["b"].weight.is_empty());
        assert_eq!(addrs(&cfg), ["10.0.0.4:80*1", "10.0.0.3:80*3"]);
        // A file that lists the added server makes it the file's: the API's weight stays as a
        // weight change; a file without the removed server forgets the removal.
        let mut cfg = config("\"10.0.0.3:80\", \"10.0.0.4:80\"");
        assert!(ch.apply_to(&mut cfg).is_empty());
        assert_eq!(addrs(&cfg), ["10.0.0.3:80*1", "10.0.0.4:80*1"]);
        assert!(ch.groups["b"].added.is_empty() && ch.groups["b"].removed.is_empty());
        assert_eq!(ch.groups["b"].weight.get(&c), Some(&3));
        ch.record_added("b", c, 3);
        // A group the file no longer has: everything for it goes, with one warning.
        let mut other = config("\"10.0.0.9:80\"");
        Arc::make_mut(&mut other.upstreams[0]).name = "c".into();
        let w = ch.apply_to(&mut other);
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].contains("1 server(s) added, 1 weight(s) set"), "{w:?}");
        assert!(ch.groups.is_empty());
    }

    #[test]
    fn undoing_a_change_forgets_it() {
        let a: SocketAddr = "10.0.0.1:80".parse().unwrap();
        let mut ch = Changes::default();
        ch.record_state("b", a, AdminState::Disabled);
        ch.record_state("b", a, AdminState::Enabled);
        ch.record_weight("b", a, 5, 1);
        ch.record_weight("b", a, 1, 1);
        assert!(ch.groups.is_empty());
        ch.record_added("b", a, 1);
        ch.record_removed("b", a);
        assert!(ch.groups.is_empty());
    }

    #[test]
    fn the_state_file_round_trips_and_a_bad_one_is_an_error() {
        let dir = std::env::temp_dir().join(format!("portico-state-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("state.json");
        let _ = std::fs::remove_file(&path);
        let mut ch = Changes::load(Some(&path)).unwrap();
        assert!(ch.groups.is_empty());
        ch.record_added("b", "10.0.0.3:80".parse().unwrap(), 2);
        ch.record_state("b", "10.0.0.1:80".parse().unwrap(), AdminState::Draining);
        ch.save().unwrap();
        let back = Changes::load(Some(&path)).unwrap();
        assert_eq!(back.groups, ch.groups);
        std::fs::write(
            &path,
            "{\"version\": 1, \"groups\": {\"b\": {\"added\": 5}}}",
        )
        .unwrap();
        let e = Changes::load(Some(&path)).unwrap_err();
        assert!(e.corrupt && e.message.contains("state.json"), "{e:?}");
        std::fs::write(
            &path,
            "{\"version\": 1, \"groups\": {\"b\": {\"weight\": {\"10.0.0.1:80\": 0}}}}",
        )
        .unwrap();
        let e = Changes::load(Some(&path)).unwrap_err();
        assert!(e.corrupt && e.message.contains("weight 0"), "{e:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
