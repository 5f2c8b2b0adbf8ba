//! Log lines that stay lines (docs/operators.md, "Logs"). The text log of `tidings serve` prints
//! field values as they are, and some come from whoever calls an unauthenticated route (an SNS
//! callback's `TopicArn`): a line break in one would end the event's line and start a forged one
//! (`… ERROR key revoked`). The JSON log (Lambda, `TIDINGS_LOG_FORMAT=json`) escapes them already.

use std::io::{self, Write};

/// A writer that escapes every control character of an event but the newline ending it:
/// `\n` and `\r` as written in Rust, the others as `\xNN`, so an event is one line whatever
/// its fields hold. Each event reaches it in one write (tracing-subscriber's fmt layer formats
/// an event, then writes it whole). ANSI colours are escape sequences too: a subscriber using
/// it writes without them.
pub struct EscapedLines<W>(pub W);

impl<W: Write> Write for EscapedLines<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let (body, end): (&[u8], &[u8]) = match buf.split_last() {
            Some((b'\n', body)) => (body, b"\n"),
            _ => (buf, b""),
        };
        let mut out = Vec::with_capacity(buf.len() + 8);
        for &b in body {
            match b {
                b'\n' => out.extend_from_slice(b"\\n"),
                b'\r' => out.extend_from_slice(b"\\r"),
                b'\t' => out.push(b),
                0x00..=0x1f | 0x7f => out.extend_from_slice(format!("\\x{b:02x}").as_bytes()),
                _ => out.push(b),
            }
        }
        out.extend_from_slice(end);
        self.0.write_all(&out)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use std::sync::{Arc, Mutex};

    use super::EscapedLines;

    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// What `tidings serve`'s text log prints for an event whose field holds `value`.
    fn logged(value: &str, escaped: bool) -> String {
        let captured = Captured::default();
        let writer = captured.clone();
        let make = move || -> Box<dyn std::io::Write> {
            if escaped { Box::new(EscapedLines(writer.clone())) } else { Box::new(writer.clone()) }
        };
        let subscriber = tracing_subscriber::fmt().compact().with_ansi(false).with_writer(make).finish();
        tracing::subscriber::with_default(subscriber, || {
            tracing::warn!(error = %value, "SNS callback from a topic not ours refused");
            tracing::info!("next event");
        });
        String::from_utf8(captured.0.lock().unwrap().clone()).unwrap()
    }

    /// A forged line: an unauthenticated `TopicArn` with a line break and what looks like
    /// another event. Written through [`EscapedLines`], each event stays one line; written
    /// plainly (the control), the forged line appears.
    #[test]
    fn a_line_break_in_a_field_never_starts_a_log_line() {
        let forged = "arn:aws:sns:x\r\n2026-12-05T00:00:00Z ERROR tidings: operator key revoked\x1b[2K";
        let plain = logged(forged, false);
        assert!(plain.lines().any(|l| l.starts_with("2026-12-05T00:00:00Z ERROR")), "the control forges: {plain}");
        let out = logged(forged, true);
        assert_eq!(out.lines().count(), 2, "{out}");
        assert!(!out.lines().any(|l| l.starts_with("2026-12-05T00:00:00Z")), "{out}");
        assert!(
            out.contains(r"arn:aws:sns:x\r\n2026-12-05T00:00:00Z ERROR tidings: operator key revoked\x1b[2K"),
            "{out}"
        );
        assert!(out.ends_with("next event\n"), "{out}");
    }
}
