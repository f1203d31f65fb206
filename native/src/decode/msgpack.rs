//! msgpack bodies decoded the way msgpack-python 1.x's C unpacker decodes them for contract/wire/frames.py
//! (`unpackb(raw=False, strict_map_key=True)`, then with `object_pairs_hook` when a map key is neither str nor
//! bin): the same values, the same map semantics, and the same exception type at the same byte, because the
//! Python path quotes that type in its `malformed_frame` message.

use bumpalo::collections::Vec as BumpVec;
use bumpalo::Bump;

/// One decoded msgpack value, borrowing strings and bytes from the frame body and its containers' elements from the
/// arena `decode` was given: a frame's tree takes one allocation, not an allocation and a free per map.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Value<'a> {
    Nil,
    Bool(bool),
    /// Every msgpack integer that fits i64 (Python: int).
    Int(i64),
    /// A msgpack uint64 above i64::MAX (Python: int).
    UInt(u64),
    Float(f64),
    Str(&'a str),
    Bin(&'a [u8]),
    Array(&'a [Value<'a>]),
    Map(Map<'a>),
    /// Any ext type but -1 (Python: msgpack.ExtType).
    Ext(i8, &'a [u8]),
    /// Ext type -1 (Python: msgpack.Timestamp).
    Timestamp {
        seconds: i64,
        nanoseconds: u32,
    },
}

/// A msgpack map. With every key a str or a bin it is a Python dict: a repeated key keeps its first position and
/// its last value. Otherwise it is a NonStringKeyMap: its pairs as sent, repeats included.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Map<'a> {
    pub entries: &'a [(Value<'a>, Value<'a>)],
    pub string_keys: bool,
}

impl<'a> Map<'a> {
    /// dict.get for a str key (None: absent; a NonStringKeyMap has no get, callers check `string_keys` first).
    pub fn get(&self, key: &str) -> Option<&Value<'a>> {
        self.entries.iter().find_map(|(k, v)| match k {
            Value::Str(s) if *s == key => Some(v),
            _ => None,
        })
    }
}

impl Value<'_> {
    /// Python's `type(value).__name__` for what msgpack-python decodes this to.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::Nil => "NoneType",
            Value::Bool(_) => "bool",
            Value::Int(_) | Value::UInt(_) => "int",
            Value::Float(_) => "float",
            Value::Str(_) => "str",
            Value::Bin(_) => "bytes",
            Value::Array(_) => "list",
            Value::Map(m) if m.string_keys => "dict",
            Value::Map(_) => "NonStringKeyMap",
            Value::Ext(..) => "ExtType",
            Value::Timestamp { .. } => "Timestamp",
        }
    }

    /// An exact (non-bool) Python int within i128.
    pub fn as_int(&self) -> Option<i128> {
        match self {
            Value::Int(i) => Some(i128::from(*i)),
            Value::UInt(u) => Some(i128::from(*u)),
            _ => None,
        }
    }
}

/// Why a body is not valid msgpack, as the exception msgpack-python raises.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecodeError {
    /// ValueError: incomplete input, a length above the body's, a bad timestamp.
    Value,
    /// FormatError: the byte 0xc1.
    Format,
    /// StackError: more than 1024 nested containers.
    Stack,
    /// UnicodeDecodeError: a str that is not UTF-8.
    Unicode,
    /// ExtraData: bytes after the first value.
    ExtraData,
}

impl DecodeError {
    pub fn type_name(self) -> &'static str {
        match self {
            DecodeError::Value => "ValueError",
            DecodeError::Format => "FormatError",
            DecodeError::Stack => "StackError",
            DecodeError::Unicode => "UnicodeDecodeError",
            DecodeError::ExtraData => "ExtraData",
        }
    }
}

/// msgpack-python's C unpacker keeps a fixed stack of this many open containers. This parser keeps its open
/// containers on the heap as well, so a deep body costs no thread stack.
const MAX_NESTED_CONTAINERS: usize = 1024;
/// Above this many entries a map's repeated keys are found with a hash set instead of a scan.
const DEDUP_SCAN_MAX: usize = 16;

/// The one value of `body`, as `msgpack.unpackb(body, raw=False, ...)` in contract/wire/frames.py decodes it, its
/// containers' elements in `arena`.
pub fn decode<'a>(body: &'a [u8], arena: &'a Bump) -> Result<Value<'a>, DecodeError> {
    let mut parser = Parser { buf: body, pos: 0 };
    let mut open: Vec<Open<'_>> = Vec::new();
    loop {
        let mut value = match parser.item()? {
            Item::Value(value) => value,
            header => match open_container(header, &mut open, (body.len(), parser.pos), arena)? {
                Some(empty) => empty,
                None => continue,
            },
        };
        // Hand the value to its container, closing every container it completes.
        loop {
            match open.last_mut() {
                None => {
                    if parser.pos < body.len() {
                        return Err(DecodeError::ExtraData);
                    }
                    return Ok(value);
                }
                Some(Open::Array { items, left }) => {
                    items.push(value);
                    *left -= 1;
                    if *left > 0 {
                        break;
                    }
                }
                Some(Open::Map {
                    entries,
                    key,
                    left,
                    string_keys,
                }) => {
                    let Some(k) = key.take() else {
                        *key = Some(value);
                        break;
                    };
                    *string_keys &= matches!(k, Value::Str(_) | Value::Bin(_));
                    entries.push((k, value));
                    *left -= 1;
                    if *left > 0 {
                        break;
                    }
                }
            }
            value = match open.pop() {
                Some(container) => container.close(arena),
                None => unreachable!("a container was just completed"),
            };
        }
    }
}

/// A container's header: its container pushed on `open` (None), or its value when it is empty; `(body_len, pos)`:
/// the body's length and the position after the header.
fn open_container<'a>(
    header: Item<'a>,
    open: &mut Vec<Open<'a>>,
    (body_len, pos): (usize, usize),
    arena: &'a Bump,
) -> Result<Option<Value<'a>>, DecodeError> {
    match header {
        Item::Value(value) => Ok(Some(value)),
        // The C unpacker checks its stack, then the length against the body's (max_array_len = len(body),
        // max_map_len = len(body) // 2), both before reading any element.
        Item::Array(_) | Item::Map(_) if open.len() >= MAX_NESTED_CONTAINERS => {
            Err(DecodeError::Stack)
        }
        Item::Array(n) if n > body_len => Err(DecodeError::Value),
        Item::Map(n) if n > body_len / 2 => Err(DecodeError::Value),
        Item::Array(0) => Ok(Some(Value::Array(&[]))),
        Item::Map(0) => Ok(Some(Value::Map(Map {
            entries: &[],
            string_keys: true,
        }))),
        Item::Array(n) => {
            // A hostile header must not reserve more than the body can hold (an element takes a byte at least).
            let items = BumpVec::with_capacity_in(n.min(body_len - pos), arena);
            open.push(Open::Array { items, left: n });
            Ok(None)
        }
        Item::Map(n) => {
            let entries = BumpVec::with_capacity_in(n.min((body_len - pos) / 2), arena);
            open.push(Open::Map {
                entries,
                key: None,
                left: n,
                string_keys: true,
            });
            Ok(None)
        }
    }
}

/// A container still reading its elements.
enum Open<'a> {
    Array {
        items: BumpVec<'a, Value<'a>>,
        left: usize,
    },
    Map {
        entries: BumpVec<'a, (Value<'a>, Value<'a>)>,
        key: Option<Value<'a>>,
        left: usize,
        string_keys: bool,
    },
}

impl<'a> Open<'a> {
    /// The completed container's value: a map's repeated keys resolved as a Python dict resolves them.
    #[inline(always)]
    fn close(self, arena: &'a Bump) -> Value<'a> {
        match self {
            Open::Array { items, .. } => Value::Array(items.into_bump_slice()),
            Open::Map {
                entries,
                string_keys,
                ..
            } => {
                let entries = entries.into_bump_slice();
                let entries = if string_keys && entries.len() > 1 {
                    dedup(entries, arena)
                } else {
                    entries
                };
                Value::Map(Map {
                    entries,
                    string_keys,
                })
            }
        }
    }
}

/// What one msgpack header starts: a whole value, or a container of n elements.
enum Item<'a> {
    Value(Value<'a>),
    Array(usize),
    Map(usize),
}

struct Parser<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Parser<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        let end = self.pos.checked_add(n).ok_or(DecodeError::Value)?;
        if end > self.buf.len() {
            return Err(DecodeError::Value); // "Unpack failed: incomplete input"
        }
        let bytes = &self.buf[self.pos..end];
        self.pos = end;
        Ok(bytes)
    }

    fn be<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let bytes = self.take(N)?;
        let mut out = [0u8; N];
        out.copy_from_slice(bytes);
        Ok(out)
    }

    /// The length that follows a bin, ext, str, array or map marker: its family's 8-, 16- or 32-bit form.
    fn len_after(&mut self, marker: u8) -> Result<usize, DecodeError> {
        match marker {
            0xc4 | 0xc7 | 0xd9 => Ok(usize::from(self.be::<1>()?[0])),
            0xc5 | 0xc8 | 0xda | 0xdc | 0xde => Ok(usize::from(u16::from_be_bytes(self.be()?))),
            // 0xc6, 0xc9, 0xdb, 0xdd, 0xdf; usize is at least 32 bits on every target this builds for.
            _ => usize::try_from(u32::from_be_bytes(self.be()?)).map_err(|_| DecodeError::Value),
        }
    }

    fn item(&mut self) -> Result<Item<'a>, DecodeError> {
        let marker = self.be::<1>()?[0];
        Ok(Item::Value(match marker {
            0x00..=0x7f => Value::Int(i64::from(marker)),
            0xe0..=0xff => Value::Int(i64::from(marker as i8)),
            0x80..=0x8f => return Ok(Item::Map(usize::from(marker & 0x0f))),
            0x90..=0x9f => return Ok(Item::Array(usize::from(marker & 0x0f))),
            0xa0..=0xbf => return self.str(usize::from(marker & 0x1f)).map(Item::Value),
            0xc0 => Value::Nil,
            0xc1 => return Err(DecodeError::Format),
            0xc2 => Value::Bool(false),
            0xc3 => Value::Bool(true),
            0xc4..=0xc6 => {
                let n = self.len_after(marker)?;
                Value::Bin(self.take(n)?)
            }
            0xc7..=0xc9 => {
                let n = self.len_after(marker)?;
                return self.ext(n).map(Item::Value);
            }
            0xca => Value::Float(f64::from(f32::from_be_bytes(self.be()?))),
            0xcb => Value::Float(f64::from_be_bytes(self.be()?)),
            0xcc => Value::Int(i64::from(self.be::<1>()?[0])),
            0xcd => Value::Int(i64::from(u16::from_be_bytes(self.be()?))),
            0xce => Value::Int(i64::from(u32::from_be_bytes(self.be()?))),
            0xcf => {
                let u = u64::from_be_bytes(self.be()?);
                i64::try_from(u).map_or(Value::UInt(u), Value::Int)
            }
            0xd0 => Value::Int(i64::from(i8::from_be_bytes(self.be()?))),
            0xd1 => Value::Int(i64::from(i16::from_be_bytes(self.be()?))),
            0xd2 => Value::Int(i64::from(i32::from_be_bytes(self.be()?))),
            0xd3 => Value::Int(i64::from_be_bytes(self.be()?)),
            0xd4 => return self.ext(1).map(Item::Value),
            0xd5 => return self.ext(2).map(Item::Value),
            0xd6 => return self.ext(4).map(Item::Value),
            0xd7 => return self.ext(8).map(Item::Value),
            0xd8 => return self.ext(16).map(Item::Value),
            0xd9..=0xdb => {
                let n = self.len_after(marker)?;
                return self.str(n).map(Item::Value);
            }
            0xdc | 0xdd => return Ok(Item::Array(self.len_after(marker)?)),
            0xde | 0xdf => return Ok(Item::Map(self.len_after(marker)?)),
        }))
    }

    fn str(&mut self, n: usize) -> Result<Value<'a>, DecodeError> {
        let bytes = self.take(n)?;
        // The wire's keys and names are short ASCII: checked inline, without from_utf8's call (which cost a third of
        // the decoder's own instructions on a frame of events).
        if bytes.is_ascii() {
            // SAFETY: ASCII bytes are UTF-8.
            return Ok(Value::Str(unsafe { std::str::from_utf8_unchecked(bytes) }));
        }
        // Python's strict UTF-8 codec and Rust's accept the same set (no surrogates, no overlongs).
        std::str::from_utf8(bytes)
            .map(Value::Str)
            .map_err(|_| DecodeError::Unicode)
    }

    fn ext(&mut self, n: usize) -> Result<Value<'a>, DecodeError> {
        let code = self.be::<1>()?[0] as i8;
        let data = self.take(n)?;
        if code >= 0 {
            return Ok(Value::Ext(code, data));
        }
        if code != -1 {
            return Err(DecodeError::Value); // msgpack.ExtType refuses codes below 0
        }
        let (seconds, nanoseconds) = match data.len() {
            4 => (
                i64::from(u32::from_be_bytes(
                    data.try_into().map_err(|_| DecodeError::Value)?,
                )),
                0u32,
            ),
            8 => {
                let v = u64::from_be_bytes(data.try_into().map_err(|_| DecodeError::Value)?);
                // 30 bits of nanoseconds over 34 bits of seconds: both fit their targets.
                ((v & 0x3_ffff_ffff) as i64, (v >> 34) as u32)
            }
            12 => {
                let nanos =
                    u32::from_be_bytes(data[..4].try_into().map_err(|_| DecodeError::Value)?);
                let secs =
                    i64::from_be_bytes(data[4..].try_into().map_err(|_| DecodeError::Value)?);
                (secs, nanos)
            }
            _ => return Err(DecodeError::Value), // "invalid timestamp data"
        };
        if nanoseconds > 999_999_999 {
            return Err(DecodeError::Value); // msgpack.Timestamp refuses it
        }
        Ok(Value::Timestamp {
            seconds,
            nanoseconds,
        })
    }
}

fn same_key(a: &Value<'_>, b: &Value<'_>) -> bool {
    match (a, b) {
        (Value::Str(x), Value::Str(y)) => x == y,
        (Value::Bin(x), Value::Bin(y)) => x == y,
        _ => false,
    }
}

/// Python dict semantics for repeated keys (str and bytes never equal each other).
fn dedup<'a>(
    entries: &'a [(Value<'a>, Value<'a>)],
    arena: &'a Bump,
) -> &'a [(Value<'a>, Value<'a>)] {
    if entries.len() <= DEDUP_SCAN_MAX {
        // The usual map has no repeated key: found so without building another.
        let repeated = (1..entries.len())
            .any(|i| entries[..i].iter().any(|(k, _)| same_key(k, &entries[i].0)));
        if !repeated {
            return entries;
        }
    }
    let mut out = BumpVec::with_capacity_in(entries.len(), arena);
    if entries.len() <= DEDUP_SCAN_MAX {
        for &(key, value) in entries {
            match out
                .iter_mut()
                .find(|(k, _): &&mut (Value<'a>, Value<'a>)| same_key(k, &key))
            {
                Some(slot) => slot.1 = value,
                None => out.push((key, value)),
            }
        }
        return out.into_bump_slice();
    }
    let mut index: std::collections::HashMap<(bool, &'a [u8]), usize> =
        std::collections::HashMap::with_capacity(entries.len());
    for &(key, value) in entries {
        let id = match key {
            Value::Str(s) => (true, s.as_bytes()),
            Value::Bin(b) => (false, b),
            _ => unreachable!("dedup is only called on maps whose keys are all str or bin"),
        };
        match index.get(&id) {
            Some(&i) => out[i].1 = value,
            None => {
                index.insert(id, out.len());
                out.push((key, value));
            }
        }
    }
    out.into_bump_slice()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `msgpack::decode` with an arena of its own, kept for the test's life.
    fn decode(body: &[u8]) -> Result<Value<'_>, DecodeError> {
        super::decode(body, Box::leak(Box::new(bumpalo::Bump::new())))
    }

    #[test]
    fn scalars_and_errors_match_msgpack_python() {
        assert_eq!(decode(b"\x01"), Ok(Value::Int(1)));
        assert_eq!(decode(b"\xff"), Ok(Value::Int(-1)));
        assert_eq!(
            decode(b"\xcf\xff\xff\xff\xff\xff\xff\xff\xff"),
            Ok(Value::UInt(u64::MAX))
        );
        assert_eq!(decode(b"\xc1"), Err(DecodeError::Format));
        assert_eq!(decode(b"\x91"), Err(DecodeError::Value));
        assert_eq!(decode(b"\x01\x02"), Err(DecodeError::ExtraData));
        assert_eq!(decode(b"\xa2\xff\xfe"), Err(DecodeError::Unicode));
        assert_eq!(decode(b"\xa3\xed\xa0\x80"), Err(DecodeError::Unicode)); // an encoded surrogate
        assert_eq!(decode(b"\xd4\xff\x00"), Err(DecodeError::Value));
        assert_eq!(
            decode(b"\xd6\xff\x00\x00\x00\x01"),
            Ok(Value::Timestamp {
                seconds: 1,
                nanoseconds: 0
            })
        );
        assert_eq!(
            decode(b"\xd7\xff\xff\xff\xff\xfc\x00\x00\x00\x01"),
            Err(DecodeError::Value)
        );
        assert_eq!(decode(b"\xd4\x05\x00"), Ok(Value::Ext(5, b"\x00")));
        assert_eq!(decode(b"\xd4\x80\x00"), Err(DecodeError::Value));
        assert_eq!(decode(b"\xdd\xff\xff\xff\xff"), Err(DecodeError::Value));
    }

    /// `marker`, a length of one written in `width` bytes, then `rest`.
    fn sized(marker: u8, width: usize, rest: &[u8]) -> Vec<u8> {
        let mut body = vec![marker];
        body.resize(width, 0);
        body.push(1);
        body.extend_from_slice(rest);
        body
    }

    #[test]
    fn each_length_form_reads_its_8_16_or_32_bit_length() {
        // (the markers of the 8-, 16- and 32-bit lengths, what follows the length, the same value's short form);
        // array and map have no 8-bit form
        let families: [(&[u8], &[u8], &[u8]); 5] = [
            (&[0xc4, 0xc5, 0xc6], b"x", b"\xc4\x01x"),
            (&[0xc7, 0xc8, 0xc9], b"\x05x", b"\xd4\x05x"),
            (&[0xd9, 0xda, 0xdb], b"x", b"\xa1x"),
            (&[0xdc, 0xdd], b"\x01", b"\x91\x01"),
            (&[0xde, 0xdf], b"\xa1a\x01", b"\x81\xa1a\x01"),
        ];
        for (markers, rest, short) in families {
            let widths = &[1, 2, 4][3 - markers.len()..];
            for (&marker, &width) in markers.iter().zip(widths) {
                let long = sized(marker, width, rest);
                assert_eq!(decode(&long), decode(short), "{long:x?}");
            }
        }
        assert_eq!(decode(b"\xc4\x01x"), Ok(Value::Bin(b"x")));
        assert_eq!(decode(b"\xd4\x05x"), Ok(Value::Ext(5, b"x")));
    }

    #[test]
    fn the_1025th_nested_container_is_a_stack_error() {
        let mut ok = vec![0x91u8; 1023];
        ok.push(0x90);
        assert!(decode(&ok).is_ok());
        let mut deep = vec![0x91u8; 1024];
        deep.push(0x90);
        assert_eq!(decode(&deep), Err(DecodeError::Stack));
        // The stack is checked before the length.
        let mut both = vec![0x91u8; 1024];
        both.extend_from_slice(b"\xdd\xff\xff\xff\xff");
        assert_eq!(decode(&both), Err(DecodeError::Stack));
    }

    #[test]
    fn repeated_keys_keep_the_first_position_and_the_last_value() {
        let Value::Map(map) = decode(b"\x83\xa1a\x01\xa1b\x02\xa1a\x03").unwrap() else {
            panic!()
        };
        assert_eq!(
            map.entries,
            vec![
                (Value::Str("a"), Value::Int(3)),
                (Value::Str("b"), Value::Int(2))
            ]
        );
        let Value::Map(map) = decode(b"\x82\xa1a\x01\xc4\x01a\x02").unwrap() else {
            panic!()
        };
        assert_eq!(map.entries.len(), 2); // "a" and b"a" differ
        let Value::Map(map) = decode(b"\x82\x01\x01\x01\x02").unwrap() else {
            panic!()
        };
        assert!(!map.string_keys);
        assert_eq!(map.entries.len(), 2); // a NonStringKeyMap keeps its pairs
    }

    #[test]
    fn many_repeated_keys_take_the_hashed_path() {
        let mut body = vec![0xde, 0x00, 40];
        for i in 0..40u8 {
            body.extend_from_slice(&[0xa1, b'a' + (i % 20), i]);
        }
        let Value::Map(map) = decode(&body).unwrap() else {
            panic!()
        };
        assert_eq!(map.entries.len(), 20);
        assert_eq!(map.entries[0], (Value::Str("a"), Value::Int(20)));
    }
}
