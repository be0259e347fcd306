//! Attributes a provider request to the process that sent it, with no help from the stack.
//!
//! The fake providers record each request's TCP peer address. While the connection is open, the
//! kernel knows which socket inode has that local address (`/proc/net/tcp`, `/proc/net/tcp6`) and
//! which process holds a file descriptor on that inode (`/proc/<pid>/fd/*`). Only the stack's own
//! processes are searched, so a lookup costs a few directory reads.

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

/// The inode of the TCP socket whose local address is `addr`.
fn socket_inode(addr: SocketAddr) -> Option<u64> {
    let (file, local) = match addr.ip() {
        IpAddr::V4(ip) => {
            let o = ip.octets();
            let hex = format!(
                "{:02X}{:02X}{:02X}{:02X}:{:04X}",
                o[3],
                o[2],
                o[1],
                o[0],
                addr.port()
            );
            ("/proc/net/tcp", hex)
        }
        IpAddr::V6(ip) => {
            let mut hex = String::new();
            for chunk in ip.octets().chunks(4) {
                for b in chunk.iter().rev() {
                    hex.push_str(&format!("{b:02X}"));
                }
            }
            ("/proc/net/tcp6", format!("{hex}:{:04X}", addr.port()))
        }
    };
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
    }
}
