//! The GGUF reader on files built byte by byte here (`fuzz/harness.rs`'s `gguf` builder): every
//! metadata value type read back, and one crafted file per bound the reader checks (counts,
//! lengths, types, dimensions, offsets, alignment, truncation at every byte), each a `State`
//! error naming the file and the field, run under a memory limit: none may allocate without
//! bound. The `llama` loader's tests are in `gguf_llama.rs`.

mod gguf_files;
#[path = "../../../fuzz/harness.rs"]
mod harness;
mod limited;

use gguf_files::{state_error, write};
use harness::gguf::{self, Builder};
use limited::limited;
use riftco_transformer::state::{GgufArray, GgufFile, GgufValue, MAX_GGUF_HEADER_BYTES};
use std::fs;

#[test]
fn every_metadata_value_type_reads_back() {
    let array = |elem: u32, count: u64, body: Vec<u8>| {
        let mut v = elem.to_le_bytes().to_vec();
        v.extend(count.to_le_bytes());
        v.extend(body);
        v
    };
    let nested = array(
        gguf::ARRAY,
        2,
        [
            array(4, 2, [1u32.to_le_bytes(), 2u32.to_le_bytes()].concat()),
            array(gguf::STRING, 1, gguf::string("x")),
        ]
        .concat(),
    );
    let b = Builder::default()
        .raw("u8", 0, vec![200])
        .raw("i8", 1, vec![0xff])
        .raw("u16", 2, 65535u16.to_le_bytes().to_vec())
        .raw("i16", 3, (-2i16).to_le_bytes().to_vec())
        .u32("u32", 4_000_000_000)
        .raw("i32", 5, (-5i32).to_le_bytes().to_vec())
        .f32("f32", 0.1)
        .raw("bool", gguf::BOOL, vec![1])
        .str("str", "héllo")
        .raw("u64", 10, u64::MAX.to_le_bytes().to_vec())
        .raw("i64", 11, i64::MIN.to_le_bytes().to_vec())
        .raw("f64", 12, 0.1f64.to_le_bytes().to_vec())
        .strings("strings", &["a", "", "ü"])
        .raw("bools", gguf::ARRAY, array(gguf::BOOL, 3, vec![0, 1, 0]))
        .raw("empty", gguf::ARRAY, array(gguf::FLOAT32, 0, vec![]))
        .raw("nested", gguf::ARRAY, nested);
    let path = write("values", &b.build());
    let f = GgufFile::open(&path).unwrap();
    let want = [
        ("u8", GgufValue::U8(200)),
        ("i8", GgufValue::I8(-1)),
        ("u16", GgufValue::U16(65535)),
        ("i16", GgufValue::I16(-2)),
        ("u32", GgufValue::U32(4_000_000_000)),
        ("i32", GgufValue::I32(-5)),
        ("f32", GgufValue::F32(0.1)),
        ("bool", GgufValue::Bool(true)),
        ("str", GgufValue::String("héllo".into())),
        ("u64", GgufValue::U64(u64::MAX)),
        ("i64", GgufValue::I64(i64::MIN)),
        ("f64", GgufValue::F64(0.1)),
        (
            "strings",
            GgufValue::Array(GgufArray::String(vec!["a".into(), "".into(), "ü".into()])),
        ),
        (
            "bools",
            GgufValue::Array(GgufArray::Bool(vec![false, true, false])),
        ),
        ("empty", GgufValue::Array(GgufArray::F32(vec![]))),
        (
            "nested",
            GgufValue::Array(GgufArray::Array(vec![
                GgufArray::U32(vec![1, 2]),
                GgufArray::String(vec!["x".into()]),
            ])),
        ),
    ];
    assert_eq!(f.metadata().len(), want.len());
    for ((key, got), (k, v)) in f.metadata().iter().zip(&want) {
        assert_eq!(key, k);
        assert_eq!(got, v, "{k}");
        assert_eq!(f.get(k), Some(v));
    }
    assert_eq!(f.version(), 3);
    assert!(f.tensors().is_empty());
}

/// A small valid file: metadata of three kinds and two F32 tensors.
fn small() -> Builder {
    Builder::default()
        .str("general.architecture", "none")
        .strings("tokens", &["a", "bc"])
        .u32("n", 3)
        .f32_tensor("t0", &[4, 2], &[1.0; 8])
        .f32_tensor("t1", &[3], &[2.0; 3])
}

/// The reason of the `State` error that opening `bytes` as a GGUF file gives.
fn open_error(name: &str, bytes: &[u8]) -> String {
    let path = write(name, bytes);
    state_error(GgufFile::open(&path), &path)
}

#[test]
fn every_truncation_is_a_clear_error() {
    limited("every_truncation_is_a_clear_error", || {
        let bytes = small().build();
        let f = GgufFile::open(&write("full", &bytes)).unwrap();
        let data_start = f.data_offset() as usize;
        for n in 0..bytes.len() {
            let path = write("cut", &bytes[..n]);
            match GgufFile::open(&path) {
                Ok(_) => assert!(n > data_start, "a file cut at {n} opened"),
                Err(e) => {
                    let text = e.to_string();
                    assert!(
                        text.contains("truncated") || text.contains("past the end"),
                        "cut at {n}: {text}"
                    );
                }
            }
        }
    });
}

/// Bytes 24.. of [`small`]'s file start the first key; 8..16 the tensor count, 16..24 the
/// metadata count.
#[test]
fn crafted_counts_and_lengths_are_refused_before_allocating() {
    limited(
        "crafted_counts_and_lengths_are_refused_before_allocating",
        || {
            let good = small().build();
            let with = |at: usize, value: &[u8]| {
                let mut b = good.clone();
                b[at..at + value.len()].copy_from_slice(value);
                b
            };
            let cases: Vec<(&str, Vec<u8>, &str)> = vec![
                (
                    "tensors",
                    with(8, &u64::MAX.to_le_bytes()),
                    "the tensor count = 18446744073709551615",
                ),
                (
                    "kvs",
                    with(16, &u64::MAX.to_le_bytes()),
                    "the metadata count = 18446744073709551615",
                ),
                (
                    "kvs-big",
                    with(16, &(1u64 << 40).to_le_bytes()),
                    "the metadata count",
                ),
                (
                    "key-len",
                    with(24, &u64::MAX.to_le_bytes()),
                    "the length of the key of metadata entry 0",
                ),
            ];
            for (name, bytes, want) in cases {
                let text = open_error(name, &bytes);
                assert!(text.contains(want), "{name}: {text}");
            }
            let text = open_error(
                "array-count",
                &Builder::default()
                    .raw(
                        "a",
                        gguf::ARRAY,
                        [4u32.to_le_bytes().to_vec(), u64::MAX.to_le_bytes().to_vec()].concat(),
                    )
                    .build(),
            );
            assert!(
                text.contains("the element count of the value of metadata key \"a\""),
                "{text}"
            );
            let text = open_error(
                "string-len",
                &Builder::default()
                    .raw("s", gguf::STRING, (1u64 << 62).to_le_bytes().to_vec())
                    .build(),
            );
            assert!(
                text.contains("the length of the value of metadata key \"s\""),
                "{text}"
            );
            // A string longer than the header bound, in a sparse file larger than the bound.
            let mut bytes = Builder::default()
                .raw(
                    "s",
                    gguf::STRING,
                    (MAX_GGUF_HEADER_BYTES + 10).to_le_bytes().to_vec(),
                )
                .build();
            bytes.truncate(bytes.len() - bytes.len() % 32);
            let path = write("beyond", &bytes);
            fs::OpenOptions::new()
                .write(true)
                .open(&path)
                .unwrap()
                .set_len(MAX_GGUF_HEADER_BYTES + 4096)
                .unwrap();
            let text = state_error(GgufFile::open(&path), &path);
            assert!(
                text.contains("may take at most the first 67108864 bytes"),
                "{text}"
            );
        },
    );
}

#[test]
fn crafted_types_and_layouts_are_refused() {
    limited("crafted_types_and_layouts_are_refused", || {
        let array = |elem: u32, count: u64| {
            [elem.to_le_bytes().to_vec(), count.to_le_bytes().to_vec()].concat()
        };
        let mut deep = array(gguf::ARRAY, 1);
        for _ in 0..9 {
            deep.extend(array(gguf::ARRAY, 1));
        }
        deep.extend(array(4, 0));
        let tensor = |ne: &[u64], ty: u32, data: usize| {
            Builder::default()
                .tensor("w", ne, ty, vec![0u8; data])
                .build()
        };
        let mut misaligned = tensor(&[4], gguf::F32, 16);
        // The offset of the one tensor set to 4: after the 24-byte preamble, its name (8 + 1
        // bytes), dimension count (4), dimension (8) and type (4).
        misaligned[24 + 9 + 4 + 8 + 4] = 4;
        let cases: Vec<(&str, Vec<u8>, &str)> = vec![
            (
                "magic",
                b"GGUL\x03\0\0\0".to_vec(),
                "not the magic \"GGUF\"",
            ),
            (
                "v1",
                Builder {
                    version: 1,
                    ..Builder::default()
                }
                .build(),
                "version 1 is not read",
            ),
            (
                "be",
                Builder {
                    version: 3 << 24,
                    ..Builder::default()
                }
                .build(),
                "big-endian",
            ),
            (
                "value-type",
                Builder::default().raw("k", 13, vec![0; 8]).build(),
                "value type 13",
            ),
            (
                "elem-type",
                Builder::default()
                    .raw("k", gguf::ARRAY, array(99, 1))
                    .build(),
                "value type 99",
            ),
            (
                "deep",
                Builder::default().raw("k", gguf::ARRAY, deep).build(),
                "nests arrays",
            ),
            (
                "utf8",
                Builder::default()
                    .raw(
                        "k",
                        gguf::STRING,
                        [2u64.to_le_bytes().to_vec(), vec![0xc3, 0x28]].concat(),
                    )
                    .build(),
                "is not UTF-8",
            ),
            (
                "dup-key",
                Builder::default().u32("k", 1).u32("k", 2).build(),
                "\"k\" appears twice",
            ),
            (
                "dup-tensor",
                Builder::default()
                    .f32_tensor("w", &[1], &[1.0])
                    .f32_tensor("w", &[1], &[1.0])
                    .build(),
                "tensor \"w\" appears twice",
            ),
            (
                "dims",
                tensor(&[1, 1, 1, 1, 1], gguf::F32, 4),
                "dimension count of tensor \"w\" is 5",
            ),
            (
                "product",
                tensor(&[1 << 32, 1 << 32], gguf::F32, 0),
                "overflows 63 bits",
            ),
            (
                "bytes",
                tensor(&[1 << 31, 1 << 31], 28, 0),
                "overflows 64 bits",
            ),
            (
                "ggml-type",
                tensor(&[4], 99, 16),
                "is 99, which is not a GGML tensor type",
            ),
            (
                "blocks",
                tensor(&[16], gguf::Q8_0, 34),
                "not a multiple of the 32-element blocks of its type Q8_0",
            ),
            (
                "past-end",
                tensor(&[64], gguf::F32, 16),
                "lies past the end of the file",
            ),
            (
                "misaligned",
                misaligned,
                "not a multiple of the alignment 32",
            ),
            (
                "align-0",
                Builder::default().u32("general.alignment", 0).build(),
                "general.alignment",
            ),
            (
                "align-3",
                Builder::default().u32("general.alignment", 3).build(),
                "expected a UINT32 power of two",
            ),
            (
                "align-type",
                Builder::default().f32("general.alignment", 32.0).build(),
                "(FLOAT32)",
            ),
        ];
        for (name, bytes, want) in cases {
            let text = open_error(name, &bytes);
            assert!(text.contains(want), "{name}: {text}");
        }
        // Another alignment moves the data section; the file reads.
        let b = Builder {
            alignment: 64,
            ..small()
        }
        .u32("general.alignment", 64);
        let f = GgufFile::open(&write("align-64", &b.build())).unwrap();
        assert_eq!((f.alignment(), f.data_offset() % 64), (64, 0));
        assert_eq!(f.read_tensor_f32("t1").unwrap(), (vec![3], vec![2.0; 3]));
    });
}
