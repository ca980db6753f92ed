//! `frugal formats` end to end: runs the built binary and checks its JSON and its errors (exit
//! code 2 and a message that says what to fix). Safetensors files are written by hand here (an
//! 8-byte little-endian header length, a JSON header, then the raw data).

use serde_json::Value;
use std::path::PathBuf;
use std::process::{Command, Output};

fn frugal(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_frugal"))
        .arg("formats")
        .args(args)
        .output()
        .expect("the frugal binary runs")
}

fn json_of(args: &[&str]) -> Value {
    let out = frugal(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "frugal formats {args:?} failed: {stderr}"
    );
    serde_json::from_slice(&out.stdout).expect("stdout is one JSON object")
}

/// Runs, expects exit code 2, returns stderr.
fn failure(args: &[&str]) -> String {
    let out = frugal(args);
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(
        out.status.code(),
        Some(2),
        "{args:?} should exit 2; stderr: {stderr}"
    );
    stderr
}

/// A safetensors file in a fresh temp path, holding `(name, dtype, shape, little-endian bytes)`.
fn write_safetensors(file: &str, tensors: &[(&str, &str, Vec<usize>, Vec<u8>)]) -> PathBuf {
    let mut header = serde_json::Map::new();
    let mut data = Vec::new();
    for (name, dtype, shape, bytes) in tensors {
        let start = data.len();
        data.extend_from_slice(bytes);
        header.insert(
            name.to_string(),
            serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [start, data.len()]}),
        );
    }
    let header = serde_json::to_vec(&Value::Object(header)).unwrap();
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&header);
    out.extend_from_slice(&data);
    let dir = std::env::temp_dir().join(format!("frugal-formats-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(file);
    std::fs::write(&path, out).unwrap();
    path
}

fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn format_entry<'a>(v: &'a Value, name: &str) -> &'a Value {
    v["formats"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["format"] == name)
        .unwrap_or_else(|| panic!("no {name} entry"))
}

#[test]
fn value_mode_reproduces_the_seed_examples() {
    let v = json_of(&["3.14", "--json"]);
    assert_eq!(format_entry(&v, "fp16")["fields"]["exponent"], "10000");
    assert_eq!(format_entry(&v, "fp16")["fields"]["mantissa"], "1001001000");
    assert_eq!(format_entry(&v, "bf16")["fields"]["mantissa"], "1001001");
    assert_eq!(format_entry(&v, "bf16")["decoded"], 3.140625);
    let pi = json_of(&["3.141592653589793", "--json"]);
    let fp32 = format_entry(&pi, "fp32");
    assert_eq!(fp32["fields"]["exponent"], "10000000");
    assert_eq!(fp32["fields"]["mantissa"], "10010010000111111011011");
    assert_eq!(format_entry(&pi, "nf4")["decoded"], 1.0);
    let neg = json_of(&["-0.5", "--json"]);
    assert_eq!(format_entry(&neg, "fp16")["hex"], "0xB800");
    // Human output: every format on its own row, plus the formulas.
    let text = String::from_utf8(frugal(&["3.14159"]).stdout).unwrap();
    for f in [
        "fp32", "fp16", "bf16", "fp8-e4m3", "fp8-e5m2", "int8", "uint8", "int4", "nf4",
    ] {
        assert!(
            text.lines().any(|l| l.starts_with(f)),
            "no row for {f}:\n{text}"
        );
    }
    assert!(
        text.contains("(-1)^0 × 2^(16-15) × (1 + 584/2^10)"),
        "{text}"
    );
}

#[test]
fn table_lists_every_format_with_computed_properties() {
    let v = json_of(&["--table", "--json"]);
    assert_eq!(v["formats"].as_array().unwrap().len(), 9);
    assert_eq!(format_entry(&v, "fp16")["max"], 65504.0);
    assert_eq!(format_entry(&v, "fp8-e4m3")["max"], 448.0);
    assert_eq!(format_entry(&v, "fp8-e4m3")["has_inf"], false);
    assert_eq!(format_entry(&v, "fp8-e5m2")["max"], 57344.0);
    assert_eq!(format_entry(&v, "bf16")["bias"], 127);
    let text = String::from_utf8(frugal(&["--table"]).stdout).unwrap();
    assert!(
        text.contains("±65504") && text.contains("satfinite"),
        "{text}"
    );
}

#[test]
fn random_values_report_error_and_the_4_125_bit_size() {
    let args = [
        "--random", "65536", "--width", "1024", "--scheme", "int4", "--group", "128",
    ];
    let v = json_of(&[&args[..], &["--json"]].concat());
    assert_eq!(v["total"]["bits_per_weight"], 4.125);
    // 65536 × 4 bits + 512 fp16 scales = 32768 + 1024 bytes.
    assert_eq!(v["total"]["stored_bytes"], 33792);
    let sqnr = v["total"]["error"]["sqnr_db"].as_f64().unwrap();
    assert!(
        (15.0..25.0).contains(&sqnr),
        "int4 g128 on Gaussians: SQNR {sqnr} dB"
    );
    let int8 = json_of(&[
        "--random", "65536", "--scheme", "int8", "--group", "row", "--json",
    ]);
    let sqnr8 = int8["total"]["error"]["sqnr_db"].as_f64().unwrap();
    assert!(
        sqnr8 > sqnr + 15.0,
        "int8 should be far better than int4: {sqnr8} vs {sqnr}"
    );
}

#[test]
fn quantizes_a_safetensors_file_and_skips_vectors() {
    let w: Vec<f32> = (0..256)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 100.0)
        .collect();
    let h: Vec<u8> = w
        .iter()
        .flat_map(|x| half::f16::from_f32(*x).to_le_bytes())
        .collect();
    let path = write_safetensors(
        "model.safetensors",
        &[
            ("layer.weight", "F32", vec![2, 128], f32_bytes(&w)),
            ("layer.half", "F16", vec![4, 64], h),
            ("layer.bias", "F32", vec![128], f32_bytes(&w[..128])),
        ],
    );
    let path = path.to_str().unwrap();
    let v = json_of(&[
        "--quantize",
        path,
        "--scheme",
        "int8",
        "--group",
        "64",
        "--json",
    ]);
    let tensors = v["tensors"].as_array().unwrap();
    assert_eq!(tensors.len(), 2);
    assert_eq!(v["skipped"][0]["name"], "layer.bias");
    assert_eq!(tensors[1]["name"], "layer.weight");
    // 256 int8 codes + 4 fp16 scales.
    assert_eq!(tensors[1]["stored_bytes"], 264);
    let max_err = tensors[1]["error"]["max_abs"].as_f64().unwrap();
    assert!(max_err <= 0.5 / 127.0 / 2.0 * 1.01, "int8 error {max_err}");
}

#[test]
fn bad_value_is_an_error_that_says_what_to_pass() {
    let err = failure(&["abc"]);
    assert!(
        err.contains("\"abc\" is not a number") && err.contains("3.14159"),
        "{err}"
    );
    failure(&[]);
}

#[test]
fn group_not_dividing_the_row_names_both_numbers_and_the_flag() {
    let err = failure(&["--random", "4096", "--width", "1000", "--group", "128"]);
    assert!(err.contains("4096") && err.contains("--width"), "{err}");
    let err = failure(&["--random", "4000", "--width", "1000", "--group", "128"]);
    assert!(
        err.contains("group size 128 does not divide the row length 1000"),
        "{err}"
    );
    assert!(err.contains("--group 125"), "{err}");
    let err = failure(&["--random", "1024", "--scheme", "nf4", "--asymmetric"]);
    assert!(err.contains("--asymmetric"), "{err}");
    let err = failure(&["--random", "1024", "--scheme", "int3"]);
    assert!(err.contains("int3") && err.contains("int4"), "{err}");
}

#[test]
fn nan_in_a_file_is_refused_with_its_position() {
    let mut w = vec![0.25f32; 64];
    w[35] = f32::NAN;
    let path = write_safetensors(
        "nan.safetensors",
        &[("w", "F32", vec![2, 32], f32_bytes(&w))],
    );
    let err = failure(&["--quantize", path.to_str().unwrap(), "--group", "32"]);
    assert!(
        err.contains("\"w\"") && err.contains("element 35 (row 1, column 3) is NaN"),
        "{err}"
    );
    assert!(err.contains("refuses NaN"), "{err}");
}

#[test]
fn unreadable_and_invalid_files_are_clear_errors() {
    let err = failure(&["--quantize", "/nonexistent/dir/model.safetensors"]);
    assert!(
        err.contains("cannot read /nonexistent/dir/model.safetensors"),
        "{err}"
    );
    let dir = std::env::temp_dir().join(format!("frugal-formats-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let junk = dir.join("junk.safetensors");
    std::fs::write(&junk, b"definitely not safetensors").unwrap();
    let err = failure(&["--quantize", junk.to_str().unwrap()]);
    assert!(err.contains("not a valid .safetensors file"), "{err}");
}

#[test]
fn double_quantized_nf4_is_bitsandbytes_storage_at_4_127_bits() {
    let dq = json_of(&[
        "--random",
        "1048576",
        "--scheme",
        "nf4",
        "--group",
        "64",
        "--double-quant",
        "--json",
    ]);
    let bits = dq["total"]["bits_per_weight"].as_f64().unwrap();
    assert!((bits - 4.127).abs() < 1e-3, "{bits}");
    assert_eq!(dq["double_quant"], true);
    // 1M values: 512 KiB of codes, 16,384 one-byte absmax codes, 64 fp32 scales and the offset.
    assert_eq!(dq["total"]["stored_bytes"], 524_288 + 16_384 + 64 * 4 + 4);
    let plain = json_of(&[
        "--random", "1048576", "--scheme", "nf4", "--group", "64", "--json",
    ]);
    let (e1, e2) = (
        dq["total"]["error"]["rmse"].as_f64().unwrap(),
        plain["total"]["error"]["rmse"].as_f64().unwrap(),
    );
    // Quantizing the absmax to 8 bits costs almost nothing in accuracy.
    assert!(e1 < e2 * 1.05, "{e1} vs {e2}");
    let err = failure(&["--random", "1024", "--scheme", "int4", "--double-quant"]);
    assert!(err.contains("--scheme nf4"), "{err}");
}
