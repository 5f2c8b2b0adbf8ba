//! Progress of the command's long work (seeding, a campaign's drain, `bench reserve`,
//! `--bootstrap`, a stream-failure replay) on stderr: an `indicatif` bar on a terminal; when
//! stderr is not a terminal (CI, logs), where the bar would be hidden, one plain line now and
//! then, so that a log still shows the work moving. stdout keeps the commands' reports.

use std::io::IsTerminal;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// How often a plain line is printed while the work moves (stderr not a terminal).
const PLAIN_EVERY: Duration = Duration::from_secs(2);

pub struct Progress {
    bar: ProgressBar,
    label: String,
    unit: &'static str,
    /// `None` on a terminal; else when the last plain line was printed.
    plain: Option<Mutex<Option<Instant>>>,
    every: Duration,
    started: Instant,
}

impl Progress {
    /// A bar of `total` steps of `unit` (`users`, `orders`, ...).
    pub fn bar(label: &str, total: u64, unit: &'static str) -> Self {
        let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
        let template = format!("{{prefix}} [{{bar:30}}] {{pos}}/{{len}} {unit}, {{msg}} ({{elapsed}})");
        if let Ok(style) = ProgressStyle::with_template(&template) {
            bar.set_style(style.progress_chars("=> "));
        }
        Self::new(bar, label, unit)
    }

    /// A spinner for work of unknown length, told in steps ([`Progress::step`]).
    pub fn spinner(label: &str) -> Self {
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
        if let Ok(style) = ProgressStyle::with_template("{spinner} {prefix} {msg} ({elapsed})") {
            bar.set_style(style);
        }
        bar.enable_steady_tick(Duration::from_millis(120));
        Self::new(bar, label, "")
    }

    fn new(bar: ProgressBar, label: &str, unit: &'static str) -> Self {
        bar.set_prefix(label.to_owned());
        let plain = (!std::io::stderr().is_terminal()).then(|| Mutex::new(None));
        Self { bar, label: label.to_owned(), unit, plain, every: PLAIN_EVERY, started: Instant::now() }
    }

    /// Plain lines at most this often (the campaign's drain line keeps its 5 s).
    pub fn every(mut self, every: Duration) -> Self {
        self.every = every;
        self
    }

    /// Where the work is: `pos` steps done, and what else there is to say (nothing: the rate
    /// since the start). A plain line is printed the first time and then every
    /// [`Progress::every`].
    pub fn set(&self, pos: u64, msg: impl Into<String>) {
        let mut msg = msg.into();
        if msg.is_empty() {
            msg = format!("{:.0}/s", pos as f64 / self.elapsed_s().max(0.001));
        }
        self.bar.set_position(pos);
        self.bar.set_message(msg.clone());
        if let Some(last) = &self.plain {
            let mut last = last.lock().unwrap_or_else(|p| p.into_inner());
            if last.is_none_or(|at| at.elapsed() >= self.every) {
                *last = Some(Instant::now());
                eprintln!("{}", self.line(pos, &msg));
            }
        }
    }

    /// One step done, printed as its own line (above the bar on a terminal).
    pub fn step(&self, line: impl AsRef<str>) {
        let line = format!("{}: {}", self.label, line.as_ref());
        self.bar.inc(1);
        if self.plain.is_some() {
            eprintln!("{line}");
        } else {
            self.bar.println(line);
        }
    }

    /// Seconds since the work began.
    pub fn elapsed_s(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// Removes the bar and prints the one-line summary of what was done.
    pub fn finish(&self, summary: impl AsRef<str>) {
        self.bar.finish_and_clear();
        eprintln!("{}: {}", self.label, summary.as_ref());
    }

    fn line(&self, pos: u64, msg: &str) -> String {
        let mut line = format!("{}: {pos}", self.label);
        if let Some(len) = self.bar.length() {
            line.push_str(&format!("/{len}"));
        }
        if !self.unit.is_empty() {
            line.push(' ');
            line.push_str(self.unit);
        }
        if !msg.is_empty() {
            line.push_str(", ");
            line.push_str(msg);
        }
        line.push_str(&format!(" ({:.1} s)", self.elapsed_s()));
        line
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        // An early return (an error) leaves no half-drawn bar behind.
        if !self.bar.is_finished() {
            self.bar.finish_and_clear();
        }
    }
}
