//! Attributes a provider request to the process that sent it, with no help from the stack.
//!
//! The fake providers record each request's TCP peer address. While the connection is open, the
//! kernel knows which socket inode has that local address (`/proc/net/tcp`, `/proc/net/tcp6`) and
//! which process holds a file descriptor on that inode (`/proc/<pid>/fd/*`). Only the stack's own
//! processes are searched. Reading `/proc/net/tcp` costs milliseconds on a busy machine (every
//! socket of the host, TIME_WAIT included), so [`Attributor::resolve_many`] answers a whole batch
//! of peers from one read: callers queue peers and resolve them off the providers' hot path.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, RwLock};

/// Maps peer socket addresses to the pids of candidate processes.
#[derive(Clone, Default)]
pub struct Attributor {
    candidates: Arc<RwLock<Vec<u32>>>,
    /// socket inode → pid; an inode is never reused while its socket is open.
    cache: Arc<Mutex<HashMap<u64, u32>>>,
}

impl Attributor {
    pub fn new() -> Attributor {
        Attributor::default()
    }

    /// Adds a process whose sockets may carry provider requests.
    pub fn add_candidate(&self, pid: u32) {
        self.candidates
            .write()
            .expect("attributor poisoned")
            .push(pid);
    }

    /// The pid owning the socket whose local address is `peer`, if it is still open and owned by a
    /// candidate process.
    pub fn resolve(&self, peer: SocketAddr) -> Option<u32> {
        let inode = socket_inode(peer)?;
        if let Some(pid) = self.cache.lock().expect("attributor poisoned").get(&inode) {
            return Some(*pid);
        }
        let want = format!("socket:[{inode}]");
        let candidates = self.candidates.read().expect("attributor poisoned").clone();
        for pid in candidates.iter().rev() {
            let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
                continue;
            };
            for fd in dir.flatten() {
                if std::fs::read_link(fd.path()).is_ok_and(|l| l.as_os_str() == want.as_str()) {
                    self.cache
                        .lock()
                        .expect("attributor poisoned")
                        .insert(inode, *pid);
                    return Some(*pid);
                }
            }
        }
        None
    }
}

impl Attributor {
    /// Resolves many peers with one read of the socket tables and one scan of the candidates'
    /// descriptors.
    pub fn resolve_many(&self, peers: &[SocketAddr]) -> Vec<Option<u32>> {
        if peers.is_empty() {
            return Vec::new();
        }
        let mut tables = String::new();
        for f in ["/proc/net/tcp", "/proc/net/tcp6"] {
            if let Ok(t) = std::fs::read_to_string(f) {
                tables.push_str(&t);
            }
        }
        let mut by_local: HashMap<&str, u64> = HashMap::new();
        for line in tables.lines() {
            let cols: Vec<&str> = line.split_whitespace().collect();
            if let (Some(local), Some(inode)) =
                (cols.get(1), cols.get(9).and_then(|i| i.parse::<u64>().ok()))
            {
                if inode != 0 {
                    by_local.insert(local, inode);
                }
            }
        }
        let inodes: Vec<Option<u64>> = peers
            .iter()
            .map(|p| by_local.get(local_hex(*p).as_str()).copied())
            .collect();
        let mut owner: HashMap<u64, u32> = self.cache.lock().expect("attributor poisoned").clone();
        if inodes.iter().flatten().any(|i| !owner.contains_key(i)) {
            let candidates = self.candidates.read().expect("attributor poisoned").clone();
            for pid in candidates {
                let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
                    continue;
                };
                for fd in dir.flatten() {
                    let Ok(link) = std::fs::read_link(fd.path()) else {
                        continue;
                    };
                    let link = link.to_string_lossy();
                    if let Some(i) = link
                        .strip_prefix("socket:[")
                        .and_then(|r| r.strip_suffix(']'))
                        .and_then(|i| i.parse().ok())
                    {
                        owner.insert(i, pid);
                    }
                }
            }
            let mut cache = self.cache.lock().expect("attributor poisoned");
            for i in inodes.iter().flatten() {
                if let Some(pid) = owner.get(i) {
                    cache.insert(*i, *pid);
                }
            }
        }
        inodes
            .into_iter()
            .map(|i| i.and_then(|i| owner.get(&i).copied()))
            .collect()
    }
}

/// The `/proc/net/tcp*` spelling of a local address.
fn local_hex(addr: SocketAddr) -> String {
    match addr.ip() {
        IpAddr::V4(ip) => {
            let o = ip.octets();
            format!(
                "{:02X}{:02X}{:02X}{:02X}:{:04X}",
                o[3],
                o[2],
                o[1],
                o[0],
                addr.port()
            )
        }
        IpAddr::V6(ip) => {
            let mut hex = String::new();
            for chunk in ip.octets().chunks(4) {
                for b in chunk.iter().rev() {
                    hex.push_str(&format!("{b:02X}"));
                }
            }
            format!("{hex}:{:04X}", addr.port())
        }
    }
}

/// The inode of the TCP socket whose local address is `addr`.
fn socket_inode(addr: SocketAddr) -> Option<u64> {
    let file = if addr.is_ipv4() {
        "/proc/net/tcp"
    } else {
        "/proc/net/tcp6"
    };
    let local = local_hex(addr);
    let text = std::fs::read_to_string(file).ok()?;
    text.lines().skip(1).find_map(|line| {
        let cols: Vec<&str> = line.split_whitespace().collect();
        (cols.get(1) == Some(&local.as_str()))
            .then(|| cols.get(9)?.parse::<u64>().ok())
            .flatten()
            .filter(|inode| *inode != 0)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_own_socket_to_own_pid() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (_server_side, peer) = listener.accept().unwrap();
        assert_eq!(peer, client.local_addr().unwrap());
        let a = Attributor::new();
        assert_eq!(a.resolve(peer), None, "not a candidate yet");
        a.add_candidate(std::process::id());
        assert_eq!(a.resolve(peer), Some(std::process::id()));
        let unknown: SocketAddr = "127.0.0.1:1".parse().unwrap();
        assert_eq!(
            a.resolve_many(&[unknown, peer]),
            vec![None, Some(std::process::id())]
        );
    }
}
