//! Python's repr of the values an error message quotes (contract/wire/messages.py builds them with f-strings), and
//! the shortest round-trip digits that both repr(float) and orjson start from.

use std::fmt::Write as _;
use std::ops::Range;

/// The shortest digits that read back as `x` (finite, sign ignored) and the decimal exponent of the first:
/// |x| = d1.d2d3... * 10^exp, as Python's repr and orjson pick them: the shortest, and of those the closest to the
/// exact value, a tie going to the even last digit. Rust's `{:e}` breaks such a tie upwards (1113178120592002.25
/// gives ...002.3 where both write ...002.2), so the same number of digits is asked again of its exactly rounded
/// (half-even) formatting, taken when it reads back as `x` too.
pub fn shortest_digits(x: f64) -> (String, i32) {
    let x = x.abs();
    let text = format!("{x:e}");
    let (digits, exp) = split_sci(&text);
    // Both neighbours of a tie read back as `x` only if an ulp spans a unit of the last digit: 16 digits or more
    // (an ulp is at most 2.2e-16 of the value).
    if digits.len() >= 15 {
        let exact = format!("{:.*e}", digits.len() - 1, x);
        if exact.parse::<f64>() == Ok(x) {
            return split_sci(&exact);
        }
    }
    (digits, exp)
}

fn split_sci(text: &str) -> (String, i32) {
    let (mantissa, exp) = text.split_once('e').unwrap_or((text, "0"));
    (
        mantissa.chars().filter(char::is_ascii_digit).collect(),
        exp.parse().unwrap_or(0),
    )
}

/// `digits` * 10^(exp - len + 1) written out without an exponent, always with a fraction ("1.0", "0.001").
pub fn write_fixed(out: &mut String, digits: &str, exp: i32) {
    let n = i32::try_from(digits.len()).unwrap_or(i32::MAX);
    if exp < 0 {
        out.push_str("0.");
        for _ in 0..(-exp - 1) {
            out.push('0');
        }
        out.push_str(digits);
    } else if exp + 1 >= n {
        out.push_str(digits);
        for _ in 0..(exp + 1 - n) {
            out.push('0');
        }
        out.push_str(".0");
    } else {
        let split = usize::try_from(exp + 1).unwrap_or(0);
        out.push_str(&digits[..split]);
        out.push('.');
        out.push_str(&digits[split..]);
    }
}

/// Python's repr(float).
pub fn float_repr(x: f64) -> String {
    if x.is_nan() {
        return "nan".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "inf".into() } else { "-inf".into() };
    }
    let mut out = String::new();
    write_shortest(&mut out, x, -4..16, 2);
    out
}

/// Finite `x` in its shortest round-trip digits: written out when its decimal exponent lies in `fixed_exps`, else as
/// `d.ddde+N` with at least `exp_digits` exponent digits (repr(float): -4..16 and 2, "1e-05"; orjson: -5..16 and
/// 1, "1e-6").
pub fn write_shortest(out: &mut String, x: f64, fixed_exps: Range<i32>, exp_digits: usize) {
    if x.is_sign_negative() {
        out.push('-');
    }
    let (digits, exp) = shortest_digits(x);
    if fixed_exps.contains(&exp) {
        write_fixed(out, &digits, exp);
    } else {
        out.push_str(&digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let _ = write!(
            out,
            "e{}{:0exp_digits$}",
            if exp < 0 { '-' } else { '+' },
            exp.unsigned_abs()
        );
    }
}

/// Python's repr(bytes).
pub fn bytes_repr(data: &[u8]) -> String {
    let quote = if data.contains(&b'\'') && !data.contains(&b'"') {
        b'"'
    } else {
        b'\''
    };
    let mut out = String::with_capacity(data.len() + 3);
    out.push('b');
    out.push(char::from(quote));
    for &c in data {
        match c {
            b'\\' => out.push_str("\\\\"),
            b'\t' => out.push_str("\\t"),
            b'\n' => out.push_str("\\n"),
            b'\r' => out.push_str("\\r"),
            _ if c == quote => {
                out.push('\\');
                out.push(char::from(c));
            }
            0x20..=0x7e => out.push(char::from(c)),
            _ => {
                let _ = write!(out, "\\x{c:02x}");
            }
        }
    }
    out.push(char::from(quote));
    out
}

/// Python's repr(str), exact for ASCII. Beyond ASCII Python asks its Unicode database which characters are
/// printable; this guesses from Rust's (controls, spaces, a few format characters). The Python view of the
/// decoder calls Python's own repr instead (decode::ErrorText), so its messages are exact.
pub fn str_repr(text: &str) -> String {
    let quote = if text.contains('\'') && !text.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::with_capacity(text.len() + 2);
    out.push(quote);
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            _ if c == quote => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            _ if c.is_ascii() || !printable_guess(c) => {
                let code = u32::from(c);
                let _ = if code < 0x100 {
                    write!(out, "\\x{code:02x}")
                } else if code < 0x1_0000 {
                    write!(out, "\\u{code:04x}")
                } else {
                    write!(out, "\\U{code:08x}")
                };
            }
            _ => out.push(c),
        }
    }
    out.push(quote);
    out
}

fn printable_guess(c: char) -> bool {
    !(c.is_control()
        || c.is_whitespace()
        || matches!(u32::from(c), 0xad | 0x200b..=0x200f | 0x202a..=0x202e | 0x2060..=0x2064 | 0xfeff))
}

/// messages._short: at most `max_chars` characters (code points, as Python counts), then "...".
pub fn short(text: &str, max_chars: usize) -> String {
    match text.char_indices().nth(max_chars) {
        None => text.to_owned(),
        Some((cut, _)) => format!("{}...", &text[..cut]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[allow(clippy::excessive_precision)] // the ties are written as their exact values
    fn float_repr_matches_python() {
        for (x, want) in [
            (0.0, "0.0"),
            (-0.0, "-0.0"),
            (1.5, "1.5"),
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (1.2345678901234568e16, "1.2345678901234568e+16"),
            (0.0001, "0.0001"),
            (1e-5, "1e-05"),
            (5e-324, "5e-324"),
            (f64::NAN, "nan"),
            (f64::NEG_INFINITY, "-inf"),
            (123.456, "123.456"),
            (1113178120592002.25, "1113178120592002.2"), // a tie: the even digit
            (111659285584252.125, "111659285584252.12"),
        ] {
            assert_eq!(float_repr(x), want, "{x}");
        }
    }

    #[test]
    fn bytes_and_str_reprs_match_python() {
        assert_eq!(bytes_repr(b"a'b"), "b\"a'b\"");
        assert_eq!(
            bytes_repr(b"a'\"\\\x00\x7f\t"),
            "b'a\\'\"\\\\\\x00\\x7f\\t'"
        );
        assert_eq!(str_repr("it's"), "\"it's\"");
        assert_eq!(str_repr("a\u{1}é\u{200b}😀"), "'a\\x01é\\u200b😀'");
    }

    #[test]
    fn short_counts_code_points() {
        assert_eq!(short("ééé", 2), "éé...");
        assert_eq!(short("ab", 2), "ab");
    }
}
