//! GGUF metadata values: the 13 value types of the format (`gguf_type` of `gguf.h`), arrays
//! stored per element type so that a large token list costs about its size in the file.

use std::fmt;

/// The value type ids of GGUF metadata.
pub(super) mod type_id {
    pub const UINT8: u32 = 0;
    pub const INT8: u32 = 1;
    pub const UINT16: u32 = 2;
    pub const INT16: u32 = 3;
    pub const UINT32: u32 = 4;
    pub const INT32: u32 = 5;
    pub const FLOAT32: u32 = 6;
    pub const BOOL: u32 = 7;
    pub const STRING: u32 = 8;
    pub const ARRAY: u32 = 9;
    pub const UINT64: u32 = 10;
    pub const INT64: u32 = 11;
    pub const FLOAT64: u32 = 12;
}

/// The name of value type `id` (`"UINT32"`), for messages.
pub(super) fn type_name(id: u32) -> &'static str {
    [
        "UINT8", "INT8", "UINT16", "INT16", "UINT32", "INT32", "FLOAT32", "BOOL", "STRING",
        "ARRAY", "UINT64", "INT64", "FLOAT64",
    ]
    .get(id as usize)
    .copied()
    .unwrap_or("unknown")
}

/// One metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum GgufValue {
    /// `UINT8`.
    U8(u8),
    /// `INT8`.
    I8(i8),
    /// `UINT16`.
    U16(u16),
    /// `INT16`.
    I16(i16),
    /// `UINT32`.
    U32(u32),
    /// `INT32`.
    I32(i32),
    /// `UINT64`.
    U64(u64),
    /// `INT64`.
    I64(i64),
    /// `FLOAT32`.
    F32(f32),
    /// `FLOAT64`.
    F64(f64),
    /// `BOOL` (a byte, 0 or 1).
    Bool(bool),
    /// `STRING` (UTF-8).
    String(String),
    /// `ARRAY` of one element type.
    Array(GgufArray),
}

/// An array value: its elements, all of one type (arrays of arrays nest).
#[derive(Clone, Debug, PartialEq)]
pub enum GgufArray {
    /// `UINT8` elements.
    U8(Vec<u8>),
    /// `INT8` elements.
    I8(Vec<i8>),
    /// `UINT16` elements.
    U16(Vec<u16>),
    /// `INT16` elements.
    I16(Vec<i16>),
    /// `UINT32` elements.
    U32(Vec<u32>),
    /// `INT32` elements.
    I32(Vec<i32>),
    /// `UINT64` elements.
    U64(Vec<u64>),
    /// `INT64` elements.
    I64(Vec<i64>),
    /// `FLOAT32` elements.
    F32(Vec<f32>),
    /// `FLOAT64` elements.
    F64(Vec<f64>),
    /// `BOOL` elements.
    Bool(Vec<bool>),
    /// `STRING` elements.
    String(Vec<String>),
    /// `ARRAY` elements.
    Array(Vec<GgufArray>),
}

/// The GGUF type id of a value or of an array's elements: [`GgufValue`] and [`GgufArray`] have
/// one variant per GGUF type, with the same names.
macro_rules! gguf_type_id {
    ($v:expr) => {
        match $v {
            Self::U8(_) => type_id::UINT8,
            Self::I8(_) => type_id::INT8,
            Self::U16(_) => type_id::UINT16,
            Self::I16(_) => type_id::INT16,
            Self::U32(_) => type_id::UINT32,
            Self::I32(_) => type_id::INT32,
            Self::U64(_) => type_id::UINT64,
            Self::I64(_) => type_id::INT64,
            Self::F32(_) => type_id::FLOAT32,
            Self::F64(_) => type_id::FLOAT64,
            Self::Bool(_) => type_id::BOOL,
            Self::String(_) => type_id::STRING,
            Self::Array(_) => type_id::ARRAY,
        }
    };
}

impl GgufArray {
    /// The number of elements.
    pub fn len(&self) -> usize {
        match self {
            Self::U8(v) => v.len(),
            Self::I8(v) => v.len(),
            Self::U16(v) => v.len(),
            Self::I16(v) => v.len(),
            Self::U32(v) => v.len(),
            Self::I32(v) => v.len(),
            Self::U64(v) => v.len(),
            Self::I64(v) => v.len(),
            Self::F32(v) => v.len(),
            Self::F64(v) => v.len(),
            Self::Bool(v) => v.len(),
            Self::String(v) => v.len(),
            Self::Array(v) => v.len(),
        }
    }

    /// Whether it has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The GGUF name of the element type.
    pub fn element_type(&self) -> &'static str {
        type_name(gguf_type_id!(self))
    }
}

impl GgufValue {
    /// The GGUF name of the value's type (`"UINT32"`, `"ARRAY"`).
    pub fn type_name(&self) -> &'static str {
        type_name(gguf_type_id!(self))
    }

    /// An integer value (any of the eight integer types) as `u64`; `None` for a negative
    /// integer or another type.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Self::U8(x) => Some(x.into()),
            Self::U16(x) => Some(x.into()),
            Self::U32(x) => Some(x.into()),
            Self::U64(x) => Some(x),
            Self::I8(x) => u64::try_from(x).ok(),
            Self::I16(x) => u64::try_from(x).ok(),
            Self::I32(x) => u64::try_from(x).ok(),
            Self::I64(x) => u64::try_from(x).ok(),
            _ => None,
        }
    }

    /// A `FLOAT32` or `FLOAT64` value as `f64` (exactly); `None` for another type.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Self::F32(x) => Some(x.into()),
            Self::F64(x) => Some(x),
            _ => None,
        }
    }

    /// A `STRING` value.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Self::String(s) => Some(s),
            _ => None,
        }
    }

    /// An `ARRAY` value.
    pub fn as_array(&self) -> Option<&GgufArray> {
        match self {
            Self::Array(a) => Some(a),
            _ => None,
        }
    }
}

impl fmt::Display for GgufValue {
    /// The value for messages: numbers and booleans as written, strings quoted and cut after 80
    /// characters, arrays as their type and length.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::U8(x) => write!(f, "{x}"),
            Self::I8(x) => write!(f, "{x}"),
            Self::U16(x) => write!(f, "{x}"),
            Self::I16(x) => write!(f, "{x}"),
            Self::U32(x) => write!(f, "{x}"),
            Self::I32(x) => write!(f, "{x}"),
            Self::U64(x) => write!(f, "{x}"),
            Self::I64(x) => write!(f, "{x}"),
            Self::F32(x) => write!(f, "{x}"),
            Self::F64(x) => write!(f, "{x}"),
            Self::Bool(x) => write!(f, "{x}"),
            Self::String(s) if s.chars().count() > 80 => {
                let cut: String = s.chars().take(80).collect();
                write!(f, "{cut:?}...")
            }
            Self::String(s) => write!(f, "{s:?}"),
            Self::Array(a) => write!(f, "[{} x {}]", a.len(), a.element_type()),
        }
    }
}
