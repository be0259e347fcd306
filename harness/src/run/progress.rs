//! Live progress on stderr while a run is going: progress bars per channel on a terminal, plain
//! periodic lines otherwise (CI logs), and every timeline event (chaos actions, restarts, exits)
//! printed as it happens in both.

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::scenario::Channel;

/// Where progress lines go; cheap to clone and safe to share with the timeline.
#[derive(Clone)]
pub enum Printer {
    Plain,
    Bars(MultiProgress),
}

impl Printer {
    /// Prints one line without tearing the bars.
    pub fn line(&self, s: &str) {
        match self {
            Printer::Plain => eprintln!("{s}"),
            Printer::Bars(m) => {
                let _ = m.println(s);
            }
        }
    }
}

/// What the display shows at one moment of a run.
pub struct Snapshot {
    pub elapsed_s: f64,
    /// Per channel: sends the providers accepted so far, and the deliveries they can accept
    /// (expected, less seeded bad addresses).
    pub accepted: BTreeMap<Channel, (u64, u64)>,
    pub faults: u64,
    pub callbacks_due: usize,
    pub workers_alive: usize,
}

impl Snapshot {
    /// The plain line printed every 2 s when stderr is not a terminal (CI logs).
    pub fn plain_line(&self) -> String {
        let channels: Vec<String> = self
            .accepted
            .iter()
            .map(|(c, (a, n))| format!("{} {a}/{n}", c.as_str()))
            .collect();
        format!(
            "[{:>5.1}s] accepted {} | faults {} | callbacks due {} | workers alive {}",
            self.elapsed_s,
            channels.join("  "),
            self.faults,
            self.callbacks_due,
            self.workers_alive
        )
    }

    /// The status line under the bars on a terminal.
    fn status(&self) -> String {
        format!(
            "faults {} | callbacks due {} | workers alive {} | {:.0}s",
            self.faults, self.callbacks_due, self.workers_alive, self.elapsed_s
        )
    }
}

/// The run's progress display.
pub struct Progress {
    printer: Option<Printer>,
    bars: BTreeMap<Channel, ProgressBar>,
    status: Option<ProgressBar>,
    last_plain: Instant,
}

impl Progress {
    /// `enabled` false: silent. Bars only when stderr is a terminal.
    pub fn new(enabled: bool) -> Progress {
        let printer = enabled.then(|| {
            if std::io::stderr().is_terminal() {
                Printer::Bars(MultiProgress::with_draw_target(
                    ProgressDrawTarget::stderr_with_hz(4),
                ))
            } else {
                Printer::Plain
            }
        });
        Progress {
            printer,
            bars: BTreeMap::new(),
            status: None,
            last_plain: Instant::now(),
        }
    }

    pub fn printer(&self) -> Option<Printer> {
        self.printer.clone()
    }

    pub fn say(&self, s: &str) {
        if let Some(p) = &self.printer {
            p.line(s);
        }
    }

    /// Shows accepted/expected per channel and the status line; plain mode prints every 2 s.
    pub fn update(&mut self, snap: &Snapshot) {
        match &self.printer {
            None => {}
            Some(Printer::Plain) if self.last_plain.elapsed() >= Duration::from_secs(2) => {
                self.last_plain = Instant::now();
                eprintln!("{}", snap.plain_line());
            }
            Some(Printer::Plain) => {}
            Some(Printer::Bars(m)) => {
                let style = ProgressStyle::with_template(
                    "{prefix:>6} [{bar:40.green/white}] {pos}/{len} accepted",
                )
                .expect("progress template")
                .progress_chars("=> ");
                for (c, (accepted, expected)) in &snap.accepted {
                    let bar = self.bars.entry(*c).or_insert_with(|| {
                        let b = m.add(ProgressBar::new(*expected));
                        b.set_style(style.clone());
                        b.set_prefix(c.as_str());
                        b
                    });
                    bar.set_length(*expected);
                    bar.set_position(*accepted);
                }
                let st = self.status.get_or_insert_with(|| {
                    let b = m.add(ProgressBar::new_spinner());
                    b.set_style(
                        ProgressStyle::with_template("{spinner} {msg}").expect("spinner template"),
                    );
                    b.enable_steady_tick(Duration::from_millis(250));
                    b
                });
                st.set_message(snap.status());
            }
        }
    }

    /// Removes the bars before the summary is printed.
    pub fn finish(&mut self) {
        for b in self.bars.values() {
            b.finish_and_clear();
        }
        if let Some(s) = &self.status {
            s.finish_and_clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_line_shows_accepted_of_expected_per_channel() {
        let snap = Snapshot {
            elapsed_s: 12.34,
            accepted: [(Channel::Line, (120, 300)), (Channel::Sms, (7, 291))].into(),
            faults: 5,
            callbacks_due: 2,
            workers_alive: 3,
        };
        assert_eq!(
            snap.plain_line(),
            "[ 12.3s] accepted line 120/300  sms 7/291 | faults 5 | callbacks due 2 | workers alive 3"
        );
    }
}
