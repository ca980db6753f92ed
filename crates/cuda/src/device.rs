//! The device: one CUDA context and stream, the loaded kernels, a cuBLAS handle, and the
//! backend's own small device allocation (the cuBLAS workspace and the reduction partials),
//! apart from the arena's slab. Device bytes are read from the driver (`cuMemGetInfo`): the
//! context's share once it exists, then every allocation this backend makes.
//!
//! Example: `if cuda::available().is_ok() { let gpu = cuda::Cuda::new(0)?; }`

use cudarc::cublas::sys as blas_sys;
use cudarc::driver::{result, sys, CudaContext, CudaStream, DriverError};
use std::collections::HashMap;
use std::ffi::{c_void, CString};
use std::sync::Arc;

pub use plan_frugal::device::{BLAS_WORKSPACE_BYTES, REDUCE_BLOCKS, SCRATCH_BYTES};

/// What went wrong before or while talking to the GPU.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    #[error("{0}")]
    Missing(String),
    #[error("no CUDA device: {0}")]
    NoDevice(String),
    #[error("CUDA driver: {0}")]
    Driver(#[from] DriverError),
    #[error("cuBLAS: {0}")]
    Blas(String),
    #[error("NVRTC could not compile kernels/{file}.cu:\n{log}")]
    Compile { file: &'static str, log: String },
}

/// Whether the driver, NVRTC and cuBLAS libraries can be loaded; the error names the missing
/// one and where it comes from. Nothing else in this crate may be called before this is Ok.
pub fn available() -> Result<(), CudaError> {
    // SAFETY: each check only tries to dlopen the library by its candidate names.
    let (driver, blas) = unsafe {
        (
            cudarc::driver::sys::is_culib_present(),
            cudarc::cublas::sys::is_culib_present(),
        )
    };
    if !driver {
        return Err(CudaError::Missing(
            "libcuda.so (the NVIDIA driver) not found: this machine has no NVIDIA GPU driver; \
             use --device cpu"
                .into(),
        ));
    }
    if !crate::ptx::nvrtc_present() {
        return Err(CudaError::Missing(
            "libnvrtc (NVRTC) not found: `pip install nvidia-cuda-nvrtc`, then add its lib \
             folder to LD_LIBRARY_PATH"
                .into(),
        ));
    }
    if !blas {
        return Err(CudaError::Missing(
            "libcublas not found: `pip install nvidia-cublas`, then add its lib folder to \
             LD_LIBRARY_PATH"
                .into(),
        ));
    }
    Ok(())
}

/// One NVIDIA GPU as an engine backend.
pub struct Cuda {
    pub(crate) ctx: Arc<CudaContext>,
    pub(crate) stream: Arc<CudaStream>,
    funcs: HashMap<&'static str, Func>,
    pub(crate) blas: Blas,
    /// The workspace and partials ([`SCRATCH_BYTES`]).
    pub(crate) scratch: u64,
    /// Device bytes the context took: total − free once the context, the modules and the
    /// cuBLAS handle exist, before this backend's first allocation (other processes' use too).
    pub context_bytes: u64,
    /// Free device bytes right after the context was made.
    free_after_context: u64,
}

#[derive(Clone, Copy)]
struct Func(sys::CUfunction, &'static [crate::ptx::Param]);
// SAFETY: a CUfunction is a handle into a module the context owns; the driver API is thread-safe.
unsafe impl Send for Func {}

pub(crate) struct Blas(pub(crate) blas_sys::cublasHandle_t);
// SAFETY: the handle is used by one thread at a time (the backend's owner), on one stream.
unsafe impl Send for Blas {}

/// The arena's device memory: one allocation.
pub struct CudaSlab {
    pub(crate) base: u64,
    pub(crate) bytes: u64,
}

impl Drop for CudaSlab {
    fn drop(&mut self) {
        if self.bytes > 0 {
            // SAFETY: `base` came from `malloc_sync` and is freed once.
            let _ = unsafe { result::free_sync(self.base) };
        }
    }
}

impl engine::backend::Accelerator for Cuda {
    type Error = CudaError;
    const SCRATCH_BYTES: u64 = SCRATCH_BYTES;

    fn open(ordinal: usize) -> Result<Cuda, CudaError> {
        Cuda::new(ordinal)
    }

    fn context_bytes(&self) -> u64 {
        self.context_bytes
    }

    /// Device bytes taken since the context was made (the backend's scratch, the slabs).
    fn bytes_in_use(&self) -> Result<u64, CudaError> {
        self.ctx.bind_to_thread()?;
        let (free, _) = result::mem_get_info()?;
        Ok(self.free_after_context.saturating_sub(free as u64))
    }

    /// Device bytes an arena may take: free once the context was up, less the backend's own
    /// scratch (in driver pages). A run config's device capacity on this GPU.
    fn capacity_bytes(&self) -> u64 {
        let scratch = plan_frugal::device::driver_bytes(&[SCRATCH_BYTES]);
        self.free_after_context.saturating_sub(scratch)
    }

    /// The GPU's name and compute capability, for reports.
    fn describe(&self) -> String {
        let name = self.ctx.name().unwrap_or_else(|_| "an NVIDIA GPU".into());
        match self.ctx.compute_capability() {
            Ok((major, minor)) => format!("{name} (sm_{major}{minor})"),
            Err(_) => name,
        }
    }
}

impl Cuda {
    /// Opens GPU `ordinal`: context, stream, every kernel (compiled or from the PTX cache),
    /// cuBLAS on the backend's workspace.
    pub fn new(ordinal: usize) -> Result<Cuda, CudaError> {
        available()?;
        let count = CudaContext::device_count()?;
        if ordinal as i32 >= count {
            return Err(CudaError::NoDevice(format!(
                "GPU {ordinal} asked for, {count} visible (check CUDA_VISIBLE_DEVICES)"
            )));
        }
        let ctx = CudaContext::new(ordinal)?;
        let stream = ctx.default_stream();
        let mut funcs = HashMap::new();
        for src in crate::ptx::SOURCES {
            let text = crate::ptx::compile_cached(src)?;
            let image = CString::new(text.clone()).expect("PTX has no NUL byte");
            // SAFETY: a NUL-terminated PTX image; the module lives as long as the context.
            let module = unsafe { result::module::load_data(image.as_ptr() as *const c_void)? };
            for name in crate::ptx::kernel_names(src.code) {
                let params = crate::ptx::entry_params(&text, name).ok_or(CudaError::Compile {
                    file: src.name,
                    log: format!("no PTX entry {name} with the parameter types launches pass"),
                })?;
                let cname = CString::new(name).expect("a kernel name");
                // SAFETY: the module was just loaded.
                let f = unsafe { result::module::get_function(module, cname)? };
                funcs.insert(name, Func(f, Vec::leak(params)));
            }
        }
        let blas = cudarc::cublas::result::create_handle()
            .map_err(|e| CudaError::Blas(format!("{e:?}")))?;
        // The context's share: driver, modules, the cuBLAS handle, before any allocation.
        let (free, total) = result::mem_get_info()?;
        // SAFETY: plain allocation of the backend's scratch.
        let scratch = unsafe { result::malloc_sync(SCRATCH_BYTES as usize)? };
        // SAFETY: the handle is live, the stream belongs to this context, the workspace is ours.
        unsafe {
            cudarc::cublas::result::set_stream(blas, stream.cu_stream() as _)
                .map_err(|e| CudaError::Blas(format!("{e:?}")))?;
            blas_sys::cublasSetWorkspace_v2(
                blas,
                scratch as *mut c_void,
                BLAS_WORKSPACE_BYTES as usize,
            )
            .result()
            .map_err(|e| CudaError::Blas(format!("{e:?}")))?;
        }
        Ok(Cuda {
            ctx,
            stream,
            funcs,
            blas: Blas(blas),
            scratch,
            context_bytes: (total - free) as u64,
            free_after_context: free as u64,
        })
    }

    pub(crate) fn cu_stream(&self) -> sys::CUstream {
        self.stream.cu_stream()
    }

    /// Waits for every launched op.
    pub fn sync(&self) {
        self.stream.synchronize().expect("CUDA stream synchronize");
    }

    pub(crate) fn alloc_slab(&self, bytes: u64) -> Result<CudaSlab, DriverError> {
        self.ctx.bind_to_thread()?;
        if bytes == 0 {
            return Ok(CudaSlab { base: 0, bytes: 0 });
        }
        // SAFETY: a plain allocation, zeroed before use.
        let base = unsafe { result::malloc_sync(bytes as usize)? };
        let slab = CudaSlab { base, bytes };
        // SAFETY: the whole allocation.
        unsafe { result::memset_d8_sync(base, 0, bytes as usize)? };
        Ok(slab)
    }

    /// Launches kernel `name` over `grid` blocks of `block` threads with `args`, in the order of
    /// the kernel's parameters.
    pub(crate) fn launch(&self, name: &str, grid: u64, block: u32, args: &[Arg]) {
        let f = self
            .funcs
            .get(name)
            .unwrap_or_else(|| panic!("no CUDA kernel {name}"));
        assert!(args.len() <= 16, "at most 16 kernel parameters");
        // The call site must pass what the PTX entry declares: a wrong count or type would
        // be read as garbage by the kernel, so it is a panic naming both.
        let matches = args.len() == f.1.len() && args.iter().zip(f.1).all(|(a, p)| a.param() == *p);
        assert!(
            matches,
            "CUDA kernel {name}: arguments {args:?} vs PTX parameters {:?}",
            f.1
        );
        // Each parameter in its own 8-byte slot; the driver reads as many bytes as the kernel's
        // parameter has (4 for a float or int: the low half, little-endian).
        let mut slots = [0u64; 16];
        for (s, a) in slots.iter_mut().zip(args) {
            *s = match *a {
                Arg::Ptr(x) | Arg::U64(x) => x,
                Arg::F32(x) => u64::from(x.to_bits()),
                Arg::I32(x) => u64::from(x as u32),
            };
        }
        let mut ptrs = [std::ptr::null_mut::<c_void>(); 16];
        for (p, s) in ptrs.iter_mut().zip(slots.iter_mut()) {
            *p = s as *mut u64 as *mut c_void;
        }
        let grid = u32::try_from(grid.clamp(1, (1 << 31) - 1)).expect("grid fits u32");
        self.ctx.bind_to_thread().expect("CUDA context");
        // SAFETY: the arguments match the kernel's signature (each call site mirrors its .cu
        // declaration) and point into live arena buffers checked by `Arena::byte_offset`.
        unsafe {
            result::launch_kernel(
                f.0,
                (grid, 1, 1),
                (block, 1, 1),
                0,
                self.cu_stream(),
                &mut ptrs[..args.len()],
            )
        }
        .unwrap_or_else(|e| panic!("CUDA kernel {name}: {e}"));
    }
}

/// One kernel parameter.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Arg {
    /// A device address (0: a null pointer).
    Ptr(u64),
    U64(u64),
    F32(f32),
    I32(i32),
}

impl Arg {
    fn param(&self) -> crate::ptx::Param {
        match self {
            Arg::Ptr(_) | Arg::U64(_) => crate::ptx::Param::U64,
            Arg::F32(_) => crate::ptx::Param::F32,
            Arg::I32(_) => crate::ptx::Param::U32,
        }
    }
}

/// Blocks of `threads` threads covering `n` items (grid-stride kernels loop past the cap).
pub(crate) fn blocks(n: u64, threads: u32) -> u64 {
    n.div_ceil(u64::from(threads)).clamp(1, 65_535 * 8)
}
