//! Every kernel source compiles to PTX with NVRTC and defines the entry points the backend
//! launches. Needs only libnvrtc (no GPU): `.ci/run` installs the `nvidia-cuda-nvrtc` wheel and
//! sets `FRUGAL_REQUIRE_NVRTC=1`, so there a missing library fails the test instead of
//! skipping it.

use cuda::ptx;

#[test]
fn every_kernel_compiles_to_ptx_with_nvrtc() {
    if !ptx::nvrtc_present() {
        assert!(
            std::env::var_os("FRUGAL_REQUIRE_NVRTC").is_none(),
            "FRUGAL_REQUIRE_NVRTC is set but libnvrtc cannot be loaded (LD_LIBRARY_PATH?)"
        );
        eprintln!("skipped: no libnvrtc on this machine (pip install nvidia-cuda-nvrtc)");
        return;
    }
    for src in ptx::SOURCES {
        let text = ptx::compile(src).unwrap_or_else(|e| panic!("{e}"));
        for name in ptx::kernel_names(src.code) {
            let params = ptx::entry_params(&text, name);
            let params = params.unwrap_or_else(|| panic!("kernels/{}.cu: {name}", src.name));
            assert!(!params.is_empty(), "{name} takes parameters");
        }
    }
}

#[test]
fn a_machine_without_the_driver_gets_an_error_naming_it() {
    // SAFETY: only tries to dlopen the driver library.
    if unsafe { cudarc::driver::sys::is_culib_present() } {
        return; // a GPU machine: `dev/gpu_check.sh` covers it
    }
    let err = cuda::Cuda::new(0).err().expect("no driver, no device");
    let msg = err.to_string();
    assert!(msg.contains("libcuda.so"), "{msg}");
    assert!(cuda::available().is_err());
}
