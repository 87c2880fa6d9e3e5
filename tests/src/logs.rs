//! Capturing what a test binary logs (one global subscriber: the worker's tasks run on many
//! threads), for assertions on log lines.

use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};

static BUF: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();

/// Captures everything logged at `level` and above in this binary, lapin's targets
/// included, without colour codes. The first call installs the subscriber; later calls
/// (with any level) only make sure it is there.
pub fn capture(level: tracing::Level) {
    BUF.get_or_init(|| {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let w = buf.clone();
        tracing_subscriber::fmt()
            .with_max_level(level)
            .with_ansi(false)
            .with_writer(move || Writer(w.clone()))
            .init();
        buf
    });
}

fn buffer() -> std::sync::MutexGuard<'static, Vec<u8>> {
    BUF.get()
        .expect("call rabbitkit_tests::logs::capture first")
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// The captured lines that contain `needle`.
pub fn lines_with(needle: &str) -> Vec<String> {
    String::from_utf8_lossy(&buffer())
        .lines()
        .filter(|l| l.contains(needle))
        .map(str::to_owned)
        .collect()
}

/// What was captured since the last call, emptying the buffer.
pub fn take() -> String {
    let mut buf = buffer();
    let s = String::from_utf8_lossy(&buf).into_owned();
    buf.clear();
    s
}

struct Writer(Arc<Mutex<Vec<u8>>>);

impl Write for Writer {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
