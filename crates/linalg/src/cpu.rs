//! The one capability cap: which instruction-set level the kernels may use, detected once and
//! capped by the caller. Every run-time dispatch in this crate — the fp32 GEMM (faer's AVX-512
//! kernel, its AVX2 one, or a plain loop), the bf16 GEMM, the quantized products, dequantization,
//! the vectorised `exp`/`tanh` loops of attention, softmax and GELU — asks [`level`] and never
//! goes above it.
//!
//! Levels, each including those below it (but `avx2vnni`, which a CPU with AVX-512 may lack):
//! - `portable`: baseline x86-64 (SSE2) or any other architecture; plain loops.
//! - `avx2`: AVX2, FMA and F16C (Haswell, Zen 1-3 and later).
//! - `avx2vnni`: also AVX-VNNI, the VEX-encoded 256-bit `vpdpbusd` (Alder Lake, Sapphire
//!   Rapids, Zen 5): the integer products' sums in one instruction. Skylake-SP, Ice Lake and
//!   Zen 4 run the levels around it, not it.
//! - `avx512`: AVX-512 F, BW and VL (Skylake-SP, and every level above).
//! - `avx512vnni`: also AVX-512 VNNI, the integer products' `vpdpbusd` (Cascade Lake, Ice Lake,
//!   Zen 4-5).
//! - `avx512bf16`: also AVX-512 BF16 (`vdpbf16ps`: Cooper Lake, Sapphire Rapids, Zen 4-5).
//! - `amx`: also AMX tiles for bf16, granted by the OS (Sapphire Rapids and later).
//!
//! The crate never reads the environment: the binary reads its `FRUGAL_ISA` once, [`parse`]s
//! it and calls [`set_cap`]; tests and benchmarks call [`set_cap`] to run a lower level on a
//! machine that has a higher one, so every path is exercised on every CPU.
//!
//! ```
//! use linalg::cpu::{self, Level};
//! assert!(cpu::detected() >= Level::Portable);
//! cpu::set_cap(Level::Portable).unwrap();
//! assert_eq!(cpu::level(), Level::Portable);
//! cpu::set_cap(cpu::detected()).unwrap();
//! ```

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::OnceLock;

/// An instruction-set level, ordered from the plainest to the widest.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    Portable,
    Avx2,
    Avx2Vnni,
    Avx512,
    Avx512Vnni,
    Avx512Bf16,
    Amx,
}

impl Level {
    /// Every level, plainest first.
    pub const ALL: [Level; 7] = [
        Level::Portable,
        Level::Avx2,
        Level::Avx2Vnni,
        Level::Avx512,
        Level::Avx512Vnni,
        Level::Avx512Bf16,
        Level::Amx,
    ];

    /// The level's name, as [`parse`] reads it and reports print it.
    pub fn name(self) -> &'static str {
        match self {
            Level::Portable => "portable",
            Level::Avx2 => "avx2",
            Level::Avx2Vnni => "avx2vnni",
            Level::Avx512 => "avx512",
            Level::Avx512Vnni => "avx512vnni",
            Level::Avx512Bf16 => "avx512bf16",
            Level::Amx => "amx",
        }
    }

    fn from_u8(x: u8) -> Level {
        Level::ALL[usize::from(x).min(Level::ALL.len() - 1)]
    }
}

impl std::fmt::Display for Level {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a cap was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CapError {
    /// Not a level's name.
    Unknown(String),
    /// A level this CPU (or OS) does not run.
    AboveCpu { asked: Level, detected: Level },
    /// A level below the CPU's best whose extension this CPU lacks (`avx2vnni` on a CPU with
    /// AVX-512 but no AVX-VNNI).
    Lacks {
        asked: Level,
        extension: &'static str,
    },
}

impl std::fmt::Display for CapError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = Level::ALL.iter().map(|l| l.name()).collect();
        match self {
            CapError::Unknown(v) => write!(
                f,
                "{v:?} is not an instruction-set level: use one of {}",
                names.join(", ")
            ),
            CapError::AboveCpu { asked, detected } => write!(
                f,
                "this CPU runs up to {detected}, not {asked}: use {} (or a lower level)",
                detected
            ),
            CapError::Lacks { asked, extension } => write!(
                f,
                "this CPU has no {extension}, which {asked} adds: use avx2 or another level \
                 it runs ({})",
                supported()
                    .iter()
                    .map(|l| l.name())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }
}

impl std::error::Error for CapError {}

/// The level named `name` (`portable`, `avx2`, `avx2vnni`, `avx512`, `avx512vnni`,
/// `avx512bf16`, `amx`).
pub fn parse(name: &str) -> Result<Level, CapError> {
    Level::ALL
        .iter()
        .copied()
        .find(|l| l.name() == name.trim().to_ascii_lowercase())
        .ok_or_else(|| CapError::Unknown(name.to_string()))
}

/// The highest level this CPU and OS run, detected once.
pub fn detected() -> Level {
    static DETECTED: OnceLock<Level> = OnceLock::new();
    *DETECTED.get_or_init(detect)
}

#[cfg(target_arch = "x86_64")]
fn detect() -> Level {
    use std::arch::is_x86_feature_detected as has;
    if !(has!("avx2") && has!("fma") && has!("f16c")) {
        return Level::Portable;
    }
    if !(has!("avx512f") && has!("avx512bw") && has!("avx512vl")) {
        return match has!("avxvnni") {
            true => Level::Avx2Vnni,
            false => Level::Avx2,
        };
    }
    // The levels are nested: one with BF16 (or AMX) but no VNNI, which no CPU has, stops here,
    // and `qmatmul::Isa::at` counts on every level above this one having VNNI.
    if !has!("avx512vnni") {
        return Level::Avx512;
    }
    if !has!("avx512bf16") {
        return Level::Avx512Vnni;
    }
    if !crate::gemm_bf16::amx_available() {
        return Level::Avx512Bf16;
    }
    Level::Amx
}

#[cfg(not(target_arch = "x86_64"))]
fn detect() -> Level {
    Level::Portable
}

/// Every level this CPU runs, plainest first (tests and benchmarks run each).
pub fn supported() -> Vec<Level> {
    Level::ALL
        .iter()
        .copied()
        .filter(|&l| l <= detected() && (l != Level::Avx2Vnni || avx_vnni_on_cpu()))
        .collect()
}

/// The cap; `u8::MAX` until [`set_cap`]: no cap.
static CAP: AtomicU8 = AtomicU8::new(u8::MAX);

/// Caps every dispatch at `cap` from now on; refused when the CPU does not run it.
pub fn set_cap(cap: Level) -> Result<(), CapError> {
    if cap > detected() {
        return Err(CapError::AboveCpu {
            asked: cap,
            detected: detected(),
        });
    }
    if cap == Level::Avx2Vnni && !avx_vnni_on_cpu() {
        return Err(CapError::Lacks {
            asked: cap,
            extension: "AVX-VNNI",
        });
    }
    CAP.store(cap as u8, Ordering::Relaxed);
    Ok(())
}

/// The level the kernels run at: what the CPU runs, capped by [`set_cap`].
pub fn level() -> Level {
    detected().min(Level::from_u8(CAP.load(Ordering::Relaxed)))
}

/// Whether the CPU has AVX-512 VNNI (`vpdpbusd`), which the `avx512vnni` level adds.
pub fn vnni_on_cpu() -> bool {
    detected() >= Level::Avx512Vnni
}

/// Whether the CPU has AVX-VNNI (the VEX-encoded 256-bit `vpdpbusd` of Alder Lake, Sapphire
/// Rapids, Zen 5 and later), which the `avx2vnni` level adds.
pub fn avx_vnni_on_cpu() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static AVX_VNNI: OnceLock<bool> = OnceLock::new();
        detected() >= Level::Avx2
            && *AVX_VNNI.get_or_init(|| std::is_x86_feature_detected!("avxvnni"))
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Whether the CPU is AMD's (its CPUID vendor string): the int4 tile loops ask for their weights
/// further ahead there ([`crate::qmatmul::int4_prefetch`]).
pub fn amd() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static AMD: OnceLock<bool> = OnceLock::new();
        *AMD.get_or_init(|| {
            // SAFETY: every x86-64 CPU has CPUID leaf 0 (a safe function from Rust 1.94 on).
            #[allow(unused_unsafe)]
            let id = unsafe { std::arch::x86_64::__cpuid(0) };
            // The vendor string is EBX, EDX, ECX: "Auth" "enti" "cAMD".
            let vendor = [id.ebx, id.edx, id.ecx].map(u32::to_le_bytes).concat();
            vendor == b"AuthenticAMD"
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_bad_ones_are_refused() {
        for l in Level::ALL {
            assert_eq!(parse(l.name()).unwrap(), l);
        }
        assert_eq!(parse("AVX2").unwrap(), Level::Avx2);
        let err = parse("sse9").unwrap_err().to_string();
        assert!(err.contains("sse9") && err.contains("avx512bf16"), "{err}");
    }

    #[test]
    fn a_cap_above_the_cpu_is_refused_naming_both() {
        if detected() == Level::Amx {
            return;
        }
        let above = Level::ALL[detected() as usize + 1];
        let err = set_cap(above).unwrap_err().to_string();
        assert!(
            err.contains(above.name()) && err.contains(detected().name()),
            "{err}"
        );
    }

    #[test]
    fn avx2vnni_is_refused_where_the_cpu_lacks_avx_vnni() {
        if avx_vnni_on_cpu() || detected() < Level::Avx2Vnni {
            return;
        }
        let err = set_cap(Level::Avx2Vnni).unwrap_err().to_string();
        assert!(err.contains("AVX-VNNI") && err.contains("avx2"), "{err}");
        assert!(!supported().contains(&Level::Avx2Vnni));
    }

    #[test]
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    fn amd_is_the_vendor_the_kernel_names() {
        let info = std::fs::read_to_string("/proc/cpuinfo").expect("/proc/cpuinfo");
        let vendor = info.lines().find(|l| l.starts_with("vendor_id"));
        let vendor = vendor.expect("a vendor_id line");
        assert_eq!(
            amd(),
            vendor.trim_end().ends_with("AuthenticAMD"),
            "{vendor}"
        );
    }

    #[test]
    fn levels_are_ordered_and_supported_ends_at_detected() {
        let s = supported();
        assert_eq!(s.first(), Some(&Level::Portable));
        assert_eq!(s.last(), Some(&detected()));
        assert!(s.windows(2).all(|w| w[0] < w[1]));
    }
}
