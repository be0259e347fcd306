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

    /// Shows `done/total` per channel and the status line; plain mode prints every 2 s.
    pub fn update(
        &mut self,
        done: &BTreeMap<Channel, (usize, usize)>,
        status: &str,
        plain_line: impl FnOnce() -> String,
    ) {
        match &self.printer {
            None => {}
            Some(Printer::Plain) if self.last_plain.elapsed() >= Duration::from_secs(2) => {
                self.last_plain = Instant::now();
                eprintln!("{}", plain_line());
            }
            Some(Printer::Plain) => {}
            Some(Printer::Bars(m)) => {
                let style = ProgressStyle::with_template(
                    "{prefix:>6} [{bar:40.green/white}] {pos}/{len} final",
                )
                .expect("progress template")
                .progress_chars("=> ");
                for (c, (d, n)) in done {
                    let bar = self.bars.entry(*c).or_insert_with(|| {
                        let b = m.add(ProgressBar::new(*n as u64));
                        b.set_style(style.clone());
                        b.set_prefix(c.as_str());
                        b
                    });
                    bar.set_length(*n as u64);
                    bar.set_position(*d as u64);
                }
                let st = self.status.get_or_insert_with(|| {
                    let b = m.add(ProgressBar::new_spinner());
                    b.set_style(
                        ProgressStyle::with_template("{spinner} {msg}").expect("spinner template"),
                    );
                    b.enable_steady_tick(Duration::from_millis(250));
                    b
                });
                st.set_message(status.to_string());
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
