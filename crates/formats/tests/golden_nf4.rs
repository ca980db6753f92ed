//! frugal's NF4 against bitsandbytes' own bytes (`dev/golden_nf4.py`, bitsandbytes 0.50 on CPU):
//! a seeded tensor of 600 full blocks of 64 and a remainder, with outliers; the packed codes and
//! fp32 absmax without double quantization, and the packed codes, 8-bit absmax codes, offset and
//! second-level scales with it, plus the dynamic map that quantizes the absmax.

use formats::bnb::{self, Absmax};
use safetensors::SafeTensors;

const DATA: &[u8] = include_bytes!("data/golden_nf4.safetensors");

fn bytes(name: &str) -> Vec<u8> {
    let st = SafeTensors::deserialize(DATA).expect("a safetensors file");
    st.tensor(name)
        .unwrap_or_else(|_| panic!("no {name}"))
        .data()
        .to_vec()
}

fn f32s(name: &str) -> Vec<f32> {
    bytes(name)
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

#[test]
fn nf4_bytes_equal_bitsandbytes() {
    let x = f32s("input");
    let q = bnb::quantize(&x, 64, false);
    assert_eq!(q.packed, bytes("packed"), "packed codes");
    let Absmax::F32(absmax) = &q.absmax else {
        panic!("single quantization keeps fp32 absmax")
    };
    assert_eq!(absmax, &f32s("absmax"), "absmax");
    assert_eq!(
        q.bits_per_weight(),
        8.0 * (19_219 + 4 * 601) as f64 / 38_437.0
    );
}

#[test]
fn double_quantization_equals_bitsandbytes() {
    assert_eq!(
        bnb::dynamic_map().to_vec(),
        f32s("dq.code"),
        "the dynamic map"
    );
    let x = f32s("input");
    let q = bnb::quantize(&x, 64, true);
    assert_eq!(q.packed, bytes("dq.packed"), "packed codes");
    let Absmax::Double {
        codes,
        offset,
        absmax2,
    } = &q.absmax
    else {
        panic!("double quantization")
    };
    let want_offset = f32s("dq.offset")[0];
    // The mean's last bit: frugal sums in f64, torch in f32 (see formats::bnb).
    assert!((offset - want_offset).abs() <= want_offset.abs() * 2.0 * f32::EPSILON);
    // The absmax codes: frugal searches the map by the CUDA kernel's rule (`dQuantize`); the
    // CPU kernel the fixture comes from uses an approximate binary search that, for a value
    // close to the middle of two entries, sometimes returns the one above. Allow that, and
    // nothing else: one code in 500 at most, each off by one.
    let want_codes = bytes("dq.absmax");
    assert_eq!(codes.len(), want_codes.len());
    let differ: Vec<(u8, u8)> = codes
        .iter()
        .zip(&want_codes)
        .filter(|(a, b)| a != b)
        .map(|(&a, &b)| (a, b))
        .collect();
    assert!(differ.len() * 500 <= codes.len(), "{differ:?}");
    assert!(
        differ.iter().all(|&(a, b)| a.abs_diff(b) == 1),
        "{differ:?}"
    );
    let want2 = f32s("dq.absmax2");
    for (a, b) in absmax2.iter().zip(&want2) {
        assert!((a - b).abs() <= b.abs() * 2.0 * f32::EPSILON, "{a} vs {b}");
    }
    // 4 + 8/64 bits per weight and a little: the remainder block and three second-level scales.
    assert!(
        (q.bits_per_weight() - 4.127).abs() < 0.003,
        "{}",
        q.bits_per_weight()
    );
}
