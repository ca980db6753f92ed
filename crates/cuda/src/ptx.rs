//! The kernel sources and their compilation: each `kernels/*.cu` file is compiled by NVRTC
//! (with `common.cuh` prepended, so no CUDA header is needed) to PTX for `compute_80` (bf16
//! arithmetic; the driver JIT-compiles it for the GPU at hand), and the PTX is cached under
//! `$FRUGAL_PTX_CACHE`, else `$XDG_CACHE_HOME/frugal/ptx`, else `~/.cache/frugal/ptx`, keyed by
//! a hash of the source and options, so a changed kernel is never served stale.
//!
//! Example: `let ptx = ptx::compile(&ptx::SOURCES[0])?;` (needs only libnvrtc, no GPU).

use crate::device::CudaError;
use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions};
use std::path::PathBuf;

/// One kernel source file.
pub struct Source {
    pub name: &'static str,
    pub code: &'static str,
}

const COMMON: &str = include_str!("../kernels/common.cuh");

/// `kernels/<name>.cu` as a [`Source`].
macro_rules! source {
    ($name:literal) => {
        Source {
            name: $name,
            code: include_str!(concat!("../kernels/", $name, ".cu")),
        }
    };
}

/// Every kernel file, in load order.
pub const SOURCES: &[Source] = &[
    source!("elementwise"),
    source!("norm"),
    source!("embed_rope"),
    source!("attention"),
    source!("train"),
];

/// The virtual architecture every kernel is compiled for.
pub const ARCH: &str = "compute_80";

/// NVRTC's flags: IEEE division and square root, no fused multiply-add (the optimizers round
/// as the CPU does), no flushing of subnormals (fp16 gradients live there).
fn options() -> Vec<String> {
    [
        "--fmad=false",
        "--prec-div=true",
        "--prec-sqrt=true",
        "--ftz=false",
    ]
    .map(String::from)
    .to_vec()
}

/// The `extern "C" __global__` functions a source defines, in order.
pub fn kernel_names(code: &str) -> Vec<&str> {
    code.split("extern \"C\" __global__ void ")
        .skip(1)
        .filter_map(|rest| rest.split('(').next())
        .map(str::trim)
        .collect()
}

/// A kernel parameter's PTX type, as `Cuda::launch` checks its arguments against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Param {
    /// `.u64`: a device pointer or a 64-bit count.
    U64,
    /// `.u32` / `.s32`: an int.
    U32,
    F32,
}

/// The parameter types of entry `name` in `ptx`, in order (`None`: no such entry, or a
/// parameter type the backend never passes).
pub fn entry_params(ptx: &str, name: &str) -> Option<Vec<Param>> {
    let head = ptx.split(&format!(".entry {name}(")).nth(1)?;
    let list = head.split(')').next()?;
    list.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| match p.split_whitespace().nth(1)? {
            ".u64" | ".s64" | ".b64" => Some(Param::U64),
            ".u32" | ".s32" | ".b32" => Some(Param::U32),
            ".f32" => Some(Param::F32),
            _ => None,
        })
        .collect()
}

/// Whether libnvrtc can be loaded (`cudarc` panics on first use otherwise).
pub fn nvrtc_present() -> bool {
    // SAFETY: only tries to dlopen the library by its candidate names.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// The full text NVRTC compiles for `src`.
fn program(src: &Source) -> String {
    format!("{COMMON}\n{}", src.code)
}

/// FNV-1a over the program and its options: the cache key.
fn key(src: &Source) -> u64 {
    let text = format!("{}|{ARCH}|{}", program(src), options().join(" "));
    text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Compiles one source to PTX text (no cache).
pub fn compile(src: &Source) -> Result<String, CudaError> {
    if !nvrtc_present() {
        return Err(CudaError::Missing(
            "libnvrtc (NVRTC, the CUDA run-time compiler) not found: install the CUDA toolkit \
             or `pip install nvidia-cuda-nvrtc` and put its lib folder on LD_LIBRARY_PATH"
                .into(),
        ));
    }
    let opts = CompileOptions {
        arch: Some(ARCH),
        options: options(),
        name: Some(format!("{}.cu", src.name)),
        ..Default::default()
    };
    compile_ptx_with_opts(program(src), opts)
        .map(|p| p.to_src())
        .map_err(|e| CudaError::Compile {
            file: src.name,
            log: match e {
                cudarc::nvrtc::CompileError::CompileError { log, .. } => {
                    log.to_string_lossy().into_owned()
                }
                other => format!("{other:?}"),
            },
        })
}

fn cache_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("FRUGAL_PTX_CACHE") {
        return Some(PathBuf::from(d));
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return Some(PathBuf::from(d).join("frugal/ptx"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/frugal/ptx"))
}

/// `compile`, served from the disk cache when this exact program was compiled before. A cache
/// that cannot be read or written is skipped (it only saves time).
pub fn compile_cached(src: &Source) -> Result<String, CudaError> {
    let path = cache_dir().map(|d| d.join(format!("{}-{:016x}.ptx", src.name, key(src))));
    if let Some(text) = path.as_ref().and_then(|p| std::fs::read_to_string(p).ok()) {
        return Ok(text);
    }
    let text = compile(src)?;
    if let Some((p, dir)) = path.as_ref().and_then(|p| Some((p, p.parent()?))) {
        if std::fs::create_dir_all(dir).is_ok() {
            // A failed write only means the next run compiles again.
            let _ = std::fs::write(p, &text);
        }
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_names_are_read_from_the_sources() {
        let names = kernel_names(SOURCES[1].code);
        assert_eq!(
            names,
            [
                "layernorm_forward",
                "rmsnorm_forward",
                "norm_backward_input",
                "norm_backward_params"
            ]
        );
        let all: Vec<_> = SOURCES.iter().flat_map(|s| kernel_names(s.code)).collect();
        assert!(all.len() >= 25, "{all:?}");
        let mut sorted = all.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), all.len(), "a kernel name is defined twice");
    }

    #[test]
    fn entry_parameters_are_read_from_ptx() {
        let ptx = ".visible .entry k(\n\t.param .u64 k_param_0,\n\t.param .u32 k_param_1,\n\t\
                   .param .f32 k_param_2\n)\n{";
        let params = entry_params(ptx, "k");
        assert_eq!(params, Some(vec![Param::U64, Param::U32, Param::F32]));
        assert_eq!(entry_params(ptx, "other"), None);
    }

    #[test]
    fn the_cache_key_changes_with_the_source() {
        let a = Source {
            name: "x",
            code: "extern \"C\" __global__ void k() {}",
        };
        let b = Source {
            name: "x",
            code: "extern \"C\" __global__ void k() { }",
        };
        assert_ne!(key(&a), key(&b));
    }
}
