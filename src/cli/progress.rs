//! The progress of `check`, `info` and `compact` as a bar with rate and ETA on stderr when it is a
//! terminal, and nothing otherwise (indicatif draws nothing to a pipe or a file), so that their
//! reports on stdout stay clean either way.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressState, ProgressStyle};

use crate::progress::Progress;

/// A progress bar over the shards of one run.
pub struct Bar(ProgressBar);

impl Bar {
    /// A bar whose lines start with `verb` ("checking"), hidden until the run starts.
    pub fn new(verb: &'static str) -> Bar {
        let bar = ProgressBar::hidden();
        let template = "{prefix} [{bar:30}] {pos}/{len} shards, {rate}, ETA {eta}: {wide_msg}";
        let style = ProgressStyle::with_template(template)
            .expect("a valid template")
            .with_key("rate", |state: &ProgressState, w: &mut dyn std::fmt::Write| {
                let _ = write!(w, "{:.0}/s", state.per_sec());
            })
            .progress_chars("=> ");
        bar.set_style(style);
        bar.set_prefix(verb);
        Bar(bar)
    }
}

impl Progress for Bar {
    fn start(&self, shards: u64) {
        self.0.set_length(shards);
        self.0.reset();
        self.0.set_draw_target(ProgressDrawTarget::stderr());
        self.0.tick();
    }

    fn array(&self, dir: &str) {
        self.0.set_message(if dir.is_empty() { "/".to_string() } else { dir.to_string() });
    }

    fn shard_done(&self) {
        self.0.inc(1);
    }

    fn finish(&self) {
        self.0.finish_and_clear();
    }
}
