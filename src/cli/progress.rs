//! Progress bars of long statements on stderr, drawn with indicatif from the engine's progress
//! reports ([`crate::format::progress`]): one bar per phase with its name, elapsed time and
//! units done of the total (a spinner when the total is unknown).
//!
//! On a terminal a bar appears only once its phase has run for [`REVEAL_AFTER`], so quick
//! statements print nothing, and it stays on screen when the phase ends, showing what it did
//! and how long it took. With `--progress always` and stderr not a terminal (a log file, a
//! pipe), cursor movements would garble the output, so every phase is written as plain lines
//! in the same layout instead: one when it starts, at most one a second while it runs, and
//! one when it ends.

use std::collections::HashMap;
use std::io::IsTerminal;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use indicatif::{HumanCount, ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::ProgressMode;
use crate::engine::FragvecSession;
use crate::format::progress::ProgressSink;

/// How long a phase runs on a terminal before its bar appears.
pub const REVEAL_AFTER: Duration = Duration::from_millis(300);

/// Makes `session` report progress on stderr as `mode` says (`auto`: when stderr is a
/// terminal).
pub fn install(session: &FragvecSession, mode: ProgressMode) {
    let terminal = std::io::stderr().is_terminal();
    let show = match mode {
        ProgressMode::Auto => terminal,
        ProgressMode::Always => true,
        ProgressMode::Never => false,
    };
    if show {
        session.set_progress(Bars::start(terminal));
    } else {
        session.clear_progress();
    }
}

/// The bars of running phases.
struct Bars {
    /// Stderr is a terminal: bars redraw in place and appear after [`REVEAL_AFTER`].
    terminal: bool,
    phases: Mutex<HashMap<u64, PhaseBar>>,
}

struct PhaseBar {
    name: String,
    total: Option<u64>,
    done: u64,
    started: Instant,
    /// On a terminal: `None` until the phase is shown.
    bar: Option<ProgressBar>,
    /// When the last plain line of the phase was written (not a terminal).
    last_line: Instant,
}

impl Bars {
    fn start(terminal: bool) -> Arc<Self> {
        let bars = Arc::new(Self {
            terminal,
            phases: Mutex::default(),
        });
        if terminal {
            // Shows phases that have run long enough, even if they report nothing meanwhile
            // (a k-means iteration, a large file write). Ends with the sink.
            let weak: Weak<Self> = Arc::downgrade(&bars);
            std::thread::spawn(move || {
                while let Some(bars) = weak.upgrade() {
                    bars.reveal_due();
                    drop(bars);
                    std::thread::sleep(Duration::from_millis(100));
                }
            });
        }
        bars
    }

    fn reveal_due(&self) {
        let mut phases = self.phases.lock().unwrap_or_else(|e| e.into_inner());
        for phase in phases.values_mut() {
            if phase.bar.is_none() && phase.started.elapsed() >= REVEAL_AFTER {
                phase.bar = Some(self.bar(phase));
            }
        }
    }

    /// A bar on the terminal showing `phase` as it is now.
    fn bar(&self, phase: &PhaseBar) -> ProgressBar {
        let target = ProgressDrawTarget::stderr();
        let template = match phase.total {
            Some(_) => "{msg:>20} [{elapsed_precise}] [{bar:30}] {human_pos}/{human_len}",
            None => "{msg:>20} [{elapsed_precise}] {spinner} {human_pos}",
        };
        let style = ProgressStyle::with_template(template)
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> ")
            .tick_chars("-\\|/ ");
        let bar = ProgressBar::with_draw_target(phase.total, target)
            .with_style(style)
            .with_message(phase.name.clone())
            .with_position(phase.done)
            .with_elapsed(phase.started.elapsed());
        bar.enable_steady_tick(Duration::from_millis(100));
        bar
    }
}

impl ProgressSink for Bars {
    fn start(&self, id: u64, name: &str, total: Option<u64>) {
        let phase = PhaseBar {
            name: name.to_string(),
            total,
            done: 0,
            started: Instant::now(),
            bar: None,
            last_line: Instant::now(),
        };
        if !self.terminal {
            plain_line(&phase);
        }
        self.phases
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, phase);
    }

    fn advance(&self, id: u64, n: u64) {
        let mut phases = self.phases.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(phase) = phases.get_mut(&id) {
            phase.done += n;
            if let Some(bar) = &phase.bar {
                bar.inc(n);
            } else if !self.terminal && phase.last_line.elapsed() >= PLAIN_LINE_EVERY {
                phase.last_line = Instant::now();
                plain_line(phase);
            }
        }
    }

    fn finish(&self, id: u64) {
        let phase = self
            .phases
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id);
        match phase {
            Some(PhaseBar { bar: Some(bar), .. }) => {
                bar.finish();
                // The finished bar stays; later output starts on the next line whatever the
                // terminal's width (indicatif pads the line to the width it detected).
                eprint!("\r\n");
            }
            Some(phase) if !self.terminal => plain_line(&phase),
            _ => {}
        }
    }
}

/// Least time between two plain lines of a running phase.
const PLAIN_LINE_EVERY: Duration = Duration::from_secs(1);

/// `phase` as one line, laid out as the bars' template: name, elapsed, done/total.
fn plain_line(phase: &PhaseBar) {
    let secs = phase.started.elapsed().as_secs();
    let counts = match phase.total {
        Some(total) => format!("{}/{}", HumanCount(phase.done), HumanCount(total)),
        None => HumanCount(phase.done).to_string(),
    };
    eprintln!(
        "{:>20} [{:02}:{:02}:{:02}] {counts}",
        phase.name,
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    );
}
