//! `frugal formats`: number formats from the command line — one value in every format with its
//! bits explained, the properties table, and quantization of a safetensors file or of seeded
//! Gaussian values with error and size reports. `--json` prints one JSON object instead.
//!
//! The numerics live in the `formats` crate; this module parses flags, reads files and prints.
//! Example: `frugal formats --random 1048576 --scheme nf4 --group 64 --double-quant --json`.

use anyhow::{bail, Context};
use formats::quant::{
    bits_per_weight, quantize, ErrorStats, Granularity, QuantConfig, Scheme, StorageSpec, Symmetry,
};
use formats::{explain, BitFields, Format, Properties, QuantError};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use term::{human_bytes, Align, Table};

const EXAMPLES: &str = "\
Examples:
  frugal formats 3.14159                       the value in every format, bits as s|e|m
  frugal formats -6.1e-5                       negative values work too
  frugal formats --table                       properties of every format
  frugal formats --quantize model.safetensors --scheme int4 --group 128
  frugal formats --random 1048576 --scheme nf4 --group 64 --scale-dtype fp32
  frugal formats --random 1048576 --scheme nf4 --group 64 --double-quant   (bitsandbytes' QLoRA storage)
  frugal formats --random 65536 --width 1024 --scheme int8 --group row --asymmetric --json

Policies: NaN or infinity in data to quantize is an error naming the first bad element; a group
size must divide the row length; scales are rounded up to the scale dtype so nothing is clipped.";

/// Show numbers in every format, the formats' properties, or quantize weights.
#[derive(clap::Args)]
#[command(after_help = EXAMPLES, allow_negative_numbers = true)]
#[command(group(
    clap::ArgGroup::new("mode")
        .required(true)
        .args(["value", "table", "quantize", "random"])
))]
pub struct Args {
    /// A number to show in every format: 3.14159, -6.1e-5, 1e30, inf, nan.
    #[arg(value_name = "VALUE", allow_hyphen_values = true)]
    value: Option<String>,
    /// Print the properties of every format (bits, bias, range, epsilon, digits, overflow rule).
    #[arg(long)]
    table: bool,
    /// Quantize every f32/f16/bf16 tensor of this .safetensors file (2-D or more, by rows of the
    /// last dimension) and report error and size per tensor and in total.
    #[arg(long, value_name = "FILE")]
    quantize: Option<PathBuf>,
    /// Quantize N Gaussian values (mean 0, standard deviation --std) from a seeded generator.
    #[arg(long, value_name = "N")]
    random: Option<usize>,
    /// Row width for --random (default 4096, or N when N is smaller); must divide N.
    #[arg(long, value_name = "W")]
    width: Option<usize>,
    /// Seed of the generator for --random.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Standard deviation of the --random values (0.02 is a typical weight init).
    #[arg(long, default_value_t = 0.02)]
    std: f64,
    /// Code format: int8, int4, nf4, fp8-e4m3, fp8-e5m2.
    #[arg(long, default_value = "int4")]
    scheme: String,
    /// Values sharing one scale: a group size dividing the row length, `row` or `tensor`.
    #[arg(long, default_value = "128")]
    group: String,
    /// Symmetric quantization: zero point 0, scale = absmax / max code (the default).
    #[arg(long, conflicts_with = "asymmetric")]
    symmetric: bool,
    /// Asymmetric quantization: unsigned codes with a zero point over [min, max] (int8/int4).
    #[arg(long)]
    asymmetric: bool,
    /// With --scheme nf4: bitsandbytes' storage (QLoRA's), blocks of --group with an fp32 absmax
    /// each, the absmax values themselves quantized to 8 bits in blocks of 256 (4.127 bits per
    /// weight at --group 64), byte for byte as bitsandbytes writes them.
    #[arg(long)]
    double_quant: bool,
    /// Float format the scales are stored in: fp16, bf16 or fp32.
    #[arg(long, default_value = "fp16")]
    scale_dtype: String,
    /// Print one JSON object instead of tables.
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    if args.table {
        return print_table(args.json);
    }
    if let Some(text) = &args.value {
        return print_value(text, args.json);
    }
    let config = quant_config(&args)?;
    if args.double_quant {
        let numeric = matches!(config.granularity, Granularity::PerGroup(_));
        if config.scheme != Scheme::Nf4 || !numeric || args.asymmetric {
            bail!(
                "--double-quant is bitsandbytes' NF4 storage: use it with --scheme nf4 and a \
                 numeric --group (64 as QLoRA), symmetric"
            );
        }
    }
    let report = match (&args.quantize, args.random) {
        (Some(path), _) => quantize_file(path, &config, args.double_quant)?,
        (None, Some(n)) => quantize_random(n, &args, &config)?,
        (None, None) => {
            bail!("nothing to do: pass a VALUE, --table, --quantize FILE or --random N")
        }
    };
    print_report(&report, &config, args.double_quant, args.json);
    Ok(())
}

/// Turns the quantization flags into a validated config.
fn quant_config(args: &Args) -> anyhow::Result<QuantConfig> {
    let scheme: Scheme = args.scheme.parse().context("--scheme")?;
    let granularity = match args.group.as_str() {
        "row" | "channel" => Granularity::PerChannel,
        "tensor" => Granularity::PerTensor,
        g => match g.parse::<usize>() {
            Ok(n) if n > 0 => Granularity::PerGroup(n),
            _ => bail!(
                "--group {g:?}: use a positive group size such as 64 or 128, `row` or `tensor`"
            ),
        },
    };
    let scale_format: Format = args.scale_dtype.parse().context("--scale-dtype")?;
    if scale_format.layout().is_none() {
        bail!("--scale-dtype {scale_format}: scales need a float format; use fp16, bf16 or fp32");
    }
    let symmetry = if args.asymmetric {
        Symmetry::Asymmetric
    } else {
        Symmetry::Symmetric
    };
    Ok(QuantConfig {
        scheme,
        granularity,
        symmetry,
        scale_format,
    })
}

fn print_value(text: &str, json_out: bool) -> anyhow::Result<()> {
    use Align::{Left, Right};
    let x: f64 = text.trim().parse().map_err(|_| {
        anyhow::anyhow!(
            "{text:?} is not a number; pass a decimal such as 3.14159, 6.1e-5, inf or nan"
        )
    })?;
    let rows: Vec<_> = Format::ALL.iter().map(|&f| (f, explain(f, x))).collect();
    if json_out {
        let formats: Vec<Value> = rows
            .iter()
            .map(|(f, e)| match e {
                Ok(e) => serde_json::to_value(e).expect("explanations serialize"),
                Err(err) => json!({"format": f.name(), "error": err.to_string()}),
            })
            .collect();
        println!("{}", json!({"input": x, "formats": formats}));
        return Ok(());
    }
    let mut table = Table::new(&[
        "format",
        "sign",
        "exponent",
        "mantissa",
        "hex",
        "decoded",
        "abs error",
        "rel error",
    ])
    .align(&[Left, Left, Left, Left, Left, Right, Right, Right]);
    let mut notes = Vec::new();
    for (format, result) in &rows {
        let Ok(e) = result else {
            let dash = || "-".to_string();
            table.row(vec![
                format.name().into(),
                dash(),
                dash(),
                dash(),
                dash(),
                dash(),
                dash(),
                dash(),
            ]);
            notes.push(format!("{format}: {}", result.as_ref().unwrap_err()));
            continue;
        };
        let (s, ex, m) = match &e.fields {
            BitFields::Float {
                sign,
                exponent,
                mantissa,
            } => (sign.clone(), exponent.clone(), mantissa.clone()),
            BitFields::Code { code } => ("".into(), "".into(), format!("code {code}")),
        };
        let opt = |v: Option<f64>| v.map(num).unwrap_or_else(|| "-".into());
        table.row(vec![
            format.name().into(),
            s,
            ex,
            m,
            e.hex.clone(),
            plain(e.decoded),
            opt(e.abs_error),
            opt(e.rel_error),
        ]);
        notes.extend(e.out_of_range.iter().map(|n| format!("{format}: {n}")));
    }
    println!(
        "{text} in every format (errors against the f64 {}):\n",
        plain(x)
    );
    print!("{}", table.render());
    println!("\nHow the bits decode, (-1)^s × 2^(e-bias) × (1 + m/2^M):");
    for (format, result) in &rows {
        if let Ok(e) = result {
            println!("  {:<9} {}", format.name(), e.formula);
        }
    }
    println!(
        "\nint8, uint8, int4 and nf4 are shown at scale 1; real use scales them (see --random)."
    );
    for note in notes {
        println!("note: {note}");
    }
    Ok(())
}

fn print_table(json_out: bool) -> anyhow::Result<()> {
    let props: Vec<Properties> = Format::ALL.iter().map(|f| f.properties()).collect();
    if json_out {
        println!("{}", json!({ "formats": props }));
        return Ok(());
    }
    let mut table = Table::new(&[
        "format",
        "bits",
        "exp",
        "mant",
        "bias",
        "max",
        "min normal",
        "min subnormal",
        "epsilon",
        "digits",
        "inf",
        "NaN",
        "overflow",
    ]);
    let opt = |v: Option<f64>| v.map(num).unwrap_or_else(|| "-".into());
    for p in &props {
        let nan = match p.nan {
            Some(formats::NanEncoding::IeeeExponentAllOnes) => "e all ones, m≠0",
            Some(formats::NanEncoding::AllOnesPattern) => "S.1111.111",
            None => "none",
        };
        let overflow = match (p.overflow, p.exponent_bits) {
            (formats::Overflow::Infinity, _) => "→ ±inf",
            (formats::Overflow::Saturate, Some(_)) => "saturate (satfinite)",
            (formats::Overflow::Saturate, None) => "saturate",
        };
        let max = match p.exponent_bits {
            Some(_) => format!("±{}", num(p.max)),
            None => format!("{}..{}", num(p.min), num(p.max)),
        };
        let int_opt = |v: Option<u32>| v.map(|v| v.to_string()).unwrap_or_else(|| "-".into());
        table.row(vec![
            p.format.name().into(),
            p.bits.to_string(),
            int_opt(p.exponent_bits),
            int_opt(p.mantissa_bits),
            p.bias.map(|b| b.to_string()).unwrap_or_else(|| "-".into()),
            max,
            opt(p.smallest_normal),
            opt(p.smallest_subnormal),
            opt(p.epsilon),
            p.decimal_digits
                .map(|d| format!("{d:.2}"))
                .unwrap_or_else(|| "-".into()),
            if p.has_inf { "yes" } else { "no" }.into(),
            nan.into(),
            overflow.into(),
        ]);
    }
    print!("{}", table.render());
    println!(
        "\nAll values are computed from the layouts: bias = 2^(E-1) - 1, epsilon = 2^-M, digits = \
         log10(2^(M+1)).\nnf4 is 16 fixed levels in [-1, 1] times a per-block absmax; int ranges \
         are codes before scaling."
    );
    Ok(())
}

mod quantize;
use quantize::*;
