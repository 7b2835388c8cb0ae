//! The GPU a CUDA crate runs on: its context and stream, checked at start-up against the
//! architecture the crate was generated for, and the crate's kernels (src/kernels/*.cu),
//! compiled for it with NVRTC once, at load.
//!
//! The CUDA libraries are loaded at run time (cudarc's dynamic loading), so the crate builds
//! on any machine; a machine without a GPU, its driver or NVRTC gets an error naming what is
//! missing, not a crash.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream};
use cudarc::nvrtc::{CompileOptions, compile_ptx_with_opts};

pub use cudarc::driver::{CudaSlice, DriverError as GpuError};

use crate::kernels::SOURCES;
use crate::{CUDA_ARCH, Error, WORKLOAD};

/// A CUDA device with this crate's kernels loaded.
pub struct Gpu {
    _context: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    /// The compiled kernel files, by module name (`matmul` for src/kernels/matmul.cu).
    modules: BTreeMap<&'static str, Arc<CudaModule>>,
    /// The functions launched so far, by module, then name: found once, then looked up without
    /// allocating at every launch.
    functions: Mutex<BTreeMap<&'static str, BTreeMap<String, CudaFunction>>>,
}

impl Gpu {
    /// Opens device 0, checks that it is of the architecture the crate was generated for
    /// (`CUDA_ARCH`), and compiles every kernel file for it.
    pub fn open() -> Result<Gpu, Error> {
        // SAFETY: each only tries to load the library; nothing is called through it yet.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(Error::NoGpu {
                reason: "the NVIDIA driver's CUDA library (libcuda.so) is not installed".into(),
            });
        }
        let context = CudaContext::new(0).map_err(|e| Error::NoGpu { reason: format!("no CUDA device 0 ({e})") })?;
        let (major, minor) = context.compute_capability()?;
        let found = format!("sm_{major}{minor}");
        if found != CUDA_ARCH {
            return Err(Error::WrongGpu { found, expected: CUDA_ARCH, workload: WORKLOAD });
        }
        // SAFETY: as above.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            return Err(Error::NoGpu {
                reason: "NVRTC (libnvrtc.so), which compiles the kernels at load, is not installed: install the CUDA toolkit, or PyPI's nvidia-cuda-nvrtc-cu12 and add its lib folder to LD_LIBRARY_PATH".into(),
            });
        }
        let mut modules = BTreeMap::new();
        for &(module, source) in SOURCES {
            let options = CompileOptions { arch: Some(CUDA_ARCH), name: Some(format!("{module}.cu")), ..Default::default() };
            let ptx = compile_ptx_with_opts(source, options)
                .map_err(|e| Error::Gpu { reason: format!("kernels/{module}.cu does not compile for {CUDA_ARCH}: {e}") })?;
            modules.insert(module, context.load_module(ptx)?);
        }
        let stream = context.default_stream();
        Ok(Gpu { _context: context, stream, modules, functions: Mutex::new(BTreeMap::new()) })
    }

    /// The stream every kernel of the crate runs on, in order.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The kernel `name` of kernel file `module`.
    pub fn function(&self, module: &'static str, name: &str) -> Result<CudaFunction, GpuError> {
        let mut functions = self.functions.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let loaded = functions.entry(module).or_default();
        if let Some(function) = loaded.get(name) {
            return Ok(function.clone());
        }
        let function = self.modules[module].load_function(name)?;
        loaded.insert(name.to_string(), function.clone());
        Ok(function)
    }

    /// Copies `host` into a new buffer on the GPU.
    pub fn upload<T: cudarc::driver::DeviceRepr>(&self, host: &[T]) -> Result<CudaSlice<T>, GpuError> {
        self.stream.clone_htod(host)
    }

    /// A new buffer of `len` zeros on the GPU.
    pub fn zeros<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
        &self,
        len: usize,
    ) -> Result<CudaSlice<T>, GpuError> {
        self.stream.alloc_zeros(len)
    }
}
