//! Mooncake's JSON-lines trace read into columns, the fast path of
//! `tokenyard.workload.MooncakeTrace` (issue 18): a replay of 100k requests spent a sixth of
//! its wall time building a Python dict and list per row.
//!
//! It takes only rows that Python's reader takes on *its* fast path (an object whose
//! `timestamp` is an int or a finite float, `input_length` an int in `[1, 2**32)`,
//! `output_length` an int in `[0, 2**32)`, `hash_ids` absent or a list of at most
//! `ceil(input_length / hash_block_size)` ints in `[0, 2**64)`, other keys any JSON value;
//! blank lines skipped), and reads them to the same numbers. Any other line, odd or
//! invalid, is handed back unread: the caller parses it with Python's `json`, so every
//! message and every accepted oddity stays Python's. The invariant: this never accepts a
//! line Python would read differently.
//!
//! Lines end as Python's universal newlines end them (`\n`, `\r\n` or a lone `\r`).

/// Rows read from a buffer of whole lines, one entry per row, and where reading stopped.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct MooncakeColumns {
    /// The row's line number (1-based; blank lines count).
    pub lines: Vec<u64>,
    /// `timestamp / 1000.0` (seconds), as Python computes it from the int or float.
    pub times_s: Vec<f64>,
    pub input_lengths: Vec<u32>,
    pub output_lengths: Vec<u32>,
    /// Row `i`'s ids are `hash_ids[hash_offsets[i]..hash_offsets[i + 1]]`; starts at 0.
    pub hash_offsets: Vec<u64>,
    pub hash_ids: Vec<u64>,
    /// Bytes of the buffer read (whole lines), from the start given.
    pub end: usize,
    /// The number of the last line read.
    pub last_line: u64,
    /// The line after the last one read, which this reader leaves to the caller: its end
    /// (past its terminator). `None` when reading stopped at the end of the buffer or its
    /// last, unterminated line (see `is_final`).
    pub handed_back: Option<usize>,
}

/// Reads whole lines of `buf` from byte `start` until a line it leaves to the caller, at
/// most `max_rows` rows, or the end. Line `first_line + 1` starts at `start`. Without
/// `is_final` a last line with no terminator (or ending in `\r`, which a `\n` may follow)
/// is left unread for the next buffer.
pub fn read_mooncake_lines(
    buf: &[u8],
    start: usize,
    first_line: u64,
    hash_block_size: u32,
    max_rows: usize,
    is_final: bool,
) -> MooncakeColumns {
    let mut out = MooncakeColumns {
        hash_offsets: vec![0],
        end: start,
        last_line: first_line,
        ..MooncakeColumns::default()
    };
    let block = u64::from(hash_block_size.max(1));
    let mut pos = start;
    while pos < buf.len() && out.lines.len() < max_rows {
        let Some((text_end, next)) = line_end(buf, pos, is_final) else {
            break;
        };
        let line = out.last_line + 1;
        let text = &buf[pos..next];
        if is_blank(text) {
            // Python's `str.isspace` over the line and its terminator (ASCII here).
        } else {
            match parse_row(&buf[pos..text_end], block, &mut out.hash_ids) {
                Some(row) => {
                    out.lines.push(line);
                    out.times_s.push(row.time_s);
                    out.input_lengths.push(row.input_length);
                    out.output_lengths.push(row.output_length);
                    out.hash_offsets.push(out.hash_ids.len() as u64);
                }
                None => {
                    // Left to the caller, which reads it as Python does.
                    let num_ids = *out.hash_offsets.last().expect("starts with 0") as usize;
                    out.hash_ids.truncate(num_ids);
                    out.handed_back = Some(next);
                    break;
                }
            }
        }
        out.last_line = line;
        pos = next;
        out.end = pos;
    }
    out
}

/// The end of the line's text and of its terminator, or `None` if the line may go on in
/// the next buffer.
fn line_end(buf: &[u8], pos: usize, is_final: bool) -> Option<(usize, usize)> {
    match buf[pos..].iter().position(|&b| b == b'\n' || b == b'\r') {
        Some(i) => {
            let at = pos + i;
            if buf[at] == b'\n' {
                Some((at, at + 1))
            } else if at + 1 < buf.len() {
                Some((at, at + 1 + usize::from(buf[at + 1] == b'\n')))
            } else if is_final {
                Some((at, at + 1))
            } else {
                None
            }
        }
        None if is_final => Some((buf.len(), buf.len())),
        None => None,
    }
}

/// Python's `str.isspace` for an ASCII line (non-ASCII lines are not blank here: the caller
/// decides them). An empty text is not blank, but never reaches here.
fn is_blank(text: &[u8]) -> bool {
    !text.is_empty()
        && text
            .iter()
            .all(|&b| matches!(b, b' ' | b'\t' | b'\n' | b'\r' | 0x0b | 0x0c | 0x1c..=0x1f))
}

struct Row {
    time_s: f64,
    input_length: u32,
    output_length: u32,
}

/// A number as JSON writes it: Python's `json` makes an int of one without fraction or
/// exponent, a float of the rest.
#[derive(Clone, Copy)]
enum Number {
    /// Magnitude and sign (`-0` is the int 0).
    Int(u128, bool),
    Float(f64),
}

impl Number {
    fn as_u64(self) -> Option<u64> {
        match self {
            Number::Int(m, negative) if !negative || m == 0 => u64::try_from(m).ok(),
            _ => None,
        }
    }
}

struct Cursor<'a> {
    text: &'a [u8],
    pos: usize,
}

/// Values nested deeper than this are left to Python (whose own limit may refuse them).
const MAX_DEPTH: u32 = 64;

impl<'a> Cursor<'a> {
    fn peek(&self) -> Option<u8> {
        self.text.get(self.pos).copied()
    }

    /// JSON whitespace (Python's `json` skips exactly these).
    fn skip_ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.pos += 1;
        }
    }

    fn eat(&mut self, byte: u8) -> Option<()> {
        (self.peek() == Some(byte)).then(|| self.pos += 1)
    }

    /// A string of printable ASCII without escapes (anything else: `None`, left to Python).
    fn string(&mut self) -> Option<&'a [u8]> {
        self.eat(b'"')?;
        let start = self.pos;
        loop {
            match self.peek()? {
                b'"' => break,
                0x20..=0x7e if self.text[self.pos] != b'\\' => self.pos += 1,
                _ => return None,
            }
        }
        let text: &'a [u8] = self.text;
        let s = &text[start..self.pos];
        self.pos += 1;
        Some(s)
    }

    /// Python's `json` number grammar: `-?(0|[1-9]\d*)(\.\d+)?([eE][-+]?\d+)?`.
    fn number(&mut self) -> Option<Number> {
        let start = self.pos;
        let negative = self.eat(b'-').is_some();
        let int_start = self.pos;
        match self.peek()? {
            b'0' => self.pos += 1,
            b'1'..=b'9' => self.digits(),
            _ => return None,
        }
        let int_end = self.pos;
        let mut is_float = false;
        if self.peek() == Some(b'.') && self.text.get(self.pos + 1).is_some_and(u8::is_ascii_digit)
        {
            self.pos += 1;
            self.digits();
            is_float = true;
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            let mark = self.pos;
            self.pos += 1;
            if matches!(self.peek(), Some(b'+' | b'-')) {
                self.pos += 1;
            }
            if self.peek().is_some_and(|b| b.is_ascii_digit()) {
                self.digits();
                is_float = true;
            } else {
                // Not an exponent: Python stops the number before the `e` (then fails on it).
                self.pos = mark;
            }
        }
        if is_float {
            let text = std::str::from_utf8(&self.text[start..self.pos]).ok()?;
            // Rust's parse rounds correctly, as Python's `float()` does.
            return text.parse::<f64>().ok().map(Number::Float);
        }
        let digits = &self.text[int_start..int_end];
        if digits.len() > 38 {
            return None;
        }
        let magnitude = digits
            .iter()
            .fold(0u128, |acc, &d| acc * 10 + u128::from(d - b'0'));
        Some(Number::Int(magnitude, negative))
    }

    fn digits(&mut self) {
        while self.peek().is_some_and(|b| b.is_ascii_digit()) {
            self.pos += 1;
        }
    }

    /// Skips any JSON value this reader can vouch Python reads without error.
    fn skip_value(&mut self, depth: u32) -> Option<()> {
        if depth > MAX_DEPTH {
            return None;
        }
        match self.peek()? {
            b'"' => self.string().map(|_| ()),
            b'{' => {
                self.pos += 1;
                self.skip_ws();
                if self.eat(b'}').is_some() {
                    return Some(());
                }
                loop {
                    self.string()?;
                    self.skip_ws();
                    self.eat(b':')?;
                    self.skip_ws();
                    self.skip_value(depth + 1)?;
                    self.skip_ws();
                    if self.eat(b',').is_none() {
                        return self.eat(b'}');
                    }
                    self.skip_ws();
                }
            }
            b'[' => {
                self.pos += 1;
                self.skip_ws();
                if self.eat(b']').is_some() {
                    return Some(());
                }
                loop {
                    self.skip_value(depth + 1)?;
                    self.skip_ws();
                    if self.eat(b',').is_none() {
                        return self.eat(b']');
                    }
                    self.skip_ws();
                }
            }
            b't' => self.word(b"true"),
            b'f' => self.word(b"false"),
            b'n' => self.word(b"null"),
            _ => self.number().map(|_| ()),
        }
    }

    fn word(&mut self, word: &[u8]) -> Option<()> {
        let end = self.pos + word.len();
        (self.text.get(self.pos..end)? == word).then(|| self.pos = end)
    }

    /// A list of ints in `[0, 2**64)`, appended to `ids`.
    fn id_list(&mut self, ids: &mut Vec<u64>) -> Option<()> {
        self.eat(b'[')?;
        self.skip_ws();
        if self.eat(b']').is_some() {
            return Some(());
        }
        loop {
            ids.push(self.number()?.as_u64()?);
            self.skip_ws();
            if self.eat(b',').is_none() {
                return self.eat(b']');
            }
            self.skip_ws();
        }
    }
}

/// One line's row, if it is one Python's fast path takes; its hash ids are appended to
/// `ids` (the caller truncates them on `None`).
fn parse_row(text: &[u8], block: u64, ids: &mut Vec<u64>) -> Option<Row> {
    let mut c = Cursor { text, pos: 0 };
    c.skip_ws();
    c.eat(b'{')?;
    c.skip_ws();
    let first_id = ids.len();
    let (mut stamp, mut input, mut output) = (None, None, None);
    // Where this row's ids start in `ids`, per occurrence of the key (a repeated key: the
    // last one counts, as in a Python dict).
    let mut ids_start = None;
    if c.eat(b'}').is_none() {
        loop {
            let key = c.string()?;
            c.skip_ws();
            c.eat(b':')?;
            c.skip_ws();
            match key {
                b"timestamp" => stamp = Some(c.number()?),
                b"input_length" => input = Some(c.number()?),
                b"output_length" => output = Some(c.number()?),
                b"hash_ids" => {
                    let at = ids.len();
                    c.id_list(ids)?;
                    ids_start = Some(at);
                }
                _ => c.skip_value(1)?,
            }
            c.skip_ws();
            if c.eat(b',').is_none() {
                c.eat(b'}')?;
                break;
            }
            c.skip_ws();
        }
    }
    c.skip_ws();
    if c.pos != text.len() {
        return None;
    }
    let time_s = match stamp? {
        // Python: an int over a float converts the int (rounding to nearest) and divides.
        Number::Int(m, negative) => {
            let m = i64::try_from(m).ok()?;
            (if negative { -m } else { m }) as f64 / 1000.0
        }
        Number::Float(f) if f.is_finite() => f / 1000.0,
        Number::Float(_) => return None,
    };
    let input_length = u32::try_from(input?.as_u64()?).ok().filter(|&n| n >= 1)?;
    let output_length = u32::try_from(output?.as_u64()?).ok()?;
    // Only the last `hash_ids` counts: drop any earlier list.
    if let Some(at) = ids_start {
        ids.drain(first_id..at);
    }
    let num_ids = (ids.len() - first_id) as u64;
    if num_ids > u64::from(input_length).div_ceil(block) {
        return None;
    }
    Some(Row {
        time_s,
        input_length,
        output_length,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(text: &str) -> MooncakeColumns {
        read_mooncake_lines(text.as_bytes(), 0, 0, 4, usize::MAX, true)
    }

    #[test]
    fn reads_rows_and_counts_blank_lines() {
        let got = read(
            "{\"timestamp\": 5, \"input_length\": 9, \"output_length\": 2, \"hash_ids\": [1, 2, 3]}\n\
             \n  \t\r\n\
             {\"hash_ids\":[],\"timestamp\":7.5,\"output_length\":0,\"input_length\":1,\"x\":{\"a\":[null,true,-1e3,\"s\"]}}",
        );
        assert_eq!(got.lines, [1, 4]);
        assert_eq!(got.times_s, [0.005, 0.0075]);
        assert_eq!(got.input_lengths, [9, 1]);
        assert_eq!(got.output_lengths, [2, 0]);
        assert_eq!(got.hash_offsets, [0, 3, 3]);
        assert_eq!(got.hash_ids, [1, 2, 3]);
        assert_eq!(got.last_line, 4);
        assert_eq!(got.handed_back, None);
    }

    #[test]
    fn hands_back_what_python_reads_otherwise() {
        for line in [
            "[1]",
            "{\"timestamp\": 1, \"input_length\": 9}",
            "{\"timestamp\": 1.0e400, \"input_length\": 9, \"output_length\": 1}",
            "{\"timestamp\": 1, \"input_length\": 9.0, \"output_length\": 1}",
            "{\"timestamp\": 1, \"input_length\": 0, \"output_length\": 1}",
            "{\"timestamp\": 1, \"input_length\": 9, \"output_length\": -1}",
            "{\"timestamp\": 1, \"input_length\": 9, \"output_length\": 1, \"hash_ids\": [1,2,3,4]}",
            "{\"timestamp\": 1, \"input_length\": 9, \"output_length\": 1, \"hash_ids\": [-1]}",
            "{\"timestamp\": 1, \"input_length\": 9, \"output_length\": 1, \"hash_ids\": [true]}",
            "{\"timestamp\": 1, \"input_length\": 9, \"output_length\": 1, \"hash_ids\": null}",
            "{\"timestamp\": 1, \"input_length\": 9, \"output_length\": 1, \"h\\u0061\": 1}",
            "{\"timestamp\": 1, \"input_length\": 9, \"output_length\": 1} x",
            "{\"timestamp\": 01, \"input_length\": 9, \"output_length\": 1}",
            "{\"timestamp\": NaN, \"input_length\": 9, \"output_length\": 1}",
            "{\"timestamp\": 1, \"input_length\": 9, \"output_length\": 1, \"é\": 1}",
        ] {
            let text = format!(
                "{{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 1}}\n{line}\n"
            );
            let got = read(&text);
            assert_eq!(got.lines, [1], "{line}");
            assert_eq!(got.handed_back, Some(text.len()), "{line}");
            assert_eq!(got.hash_ids, [] as [u64; 0], "{line}");
        }
    }

    #[test]
    fn the_last_repeated_key_counts() {
        let got = read(
            "{\"hash_ids\": [7, 8], \"timestamp\": 1, \"input_length\": 5, \"output_length\": 3, \"hash_ids\": [9], \"timestamp\": -0}",
        );
        assert_eq!(got.hash_ids, [9]);
        assert_eq!(got.times_s, [0.0]);
    }

    #[test]
    fn lines_end_as_universal_newlines_and_wait_for_the_rest() {
        let row = "{\"timestamp\": 1, \"input_length\": 1, \"output_length\": 1}";
        let text = format!("{row}\r{row}\r\n{row}\r");
        let partial = read_mooncake_lines(text.as_bytes(), 0, 10, 4, usize::MAX, false);
        assert_eq!(
            partial.lines,
            [11, 12],
            "a trailing \\r may be half of \\r\\n"
        );
        assert_eq!(partial.end, 2 * row.len() + 3);
        let rest = read_mooncake_lines(text.as_bytes(), partial.end, 12, 4, usize::MAX, true);
        assert_eq!(rest.lines, [13]);
        assert_eq!(rest.end, text.len());
        let capped = read_mooncake_lines(text.as_bytes(), 0, 0, 4, 1, true);
        assert_eq!(capped.lines, [1]);
        assert_eq!(capped.end, row.len() + 1);
    }
}
