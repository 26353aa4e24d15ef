//! `folioswap._folioswap`: the engine under the Python package `folioswap`.
//!
//! The face people use (`folioswap.Engine`, `Engine.zeros`, `Engine.stats`) is written in
//! Python (`folioswap/__init__.py`) over the two classes here:
//!
//! - [`PyEngine`] (`_folioswap.Engine`) holds a `folioswap::Engine` handle;
//! - [`Mapping`] holds one `folioswap::Region` and exposes its bytes through numpy's
//!   `__array_interface__`, so that `numpy.asarray(mapping)` is an array whose `.base` is
//!   the mapping: the array, and every view of it, keeps the region alive.
//!
//! Lifetime: a `Region` holds a clone of its `Engine` handle, and the engine's threads stop
//! when the last handle goes (`folioswap::Engine`), so an array keeps its engine running
//! after the Python `Engine` object is gone.

use folioswap::{Config, Engine, Region, RegionOptions, ENV_VARS, PRELOAD_VARS};
use pyo3::exceptions::{PyOSError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// An engine error as a Python exception: a value the engine does not accept is a
/// `ValueError`; anything the system refused is an `OSError`, with its errno where the
/// engine knows it (so `OSError(errno, …)` becomes `PermissionError`, `FileNotFoundError`,
/// … as Python's own do). The message is the engine's, unchanged.
fn to_py(e: folioswap::Error) -> PyErr {
    use folioswap::swapfile::io::SwapFileError;
    use folioswap::Error as E;
    let message = e.to_string();
    let errno = match &e {
        E::Config { .. } | E::InvalidRegion(_) => return PyValueError::new_err(message),
        E::UserfaultfdUnavailable { errno } | E::Map { errno, .. } => Some(*errno),
        E::SwapFile(SwapFileError::Exists { .. }) => Some(libc::EEXIST),
        E::SwapFile(SwapFileError::NoSpace { .. }) => Some(libc::ENOSPC),
        other => io_errno(other),
    };
    match errno {
        Some(errno) => PyOSError::new_err((errno, message)),
        None => PyOSError::new_err(message),
    }
}

/// The errno of the first `io::Error` among `e`'s sources.
fn io_errno(e: &(dyn std::error::Error + 'static)) -> Option<i32> {
    let mut source = e.source();
    while let Some(s) = source {
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            return io.raw_os_error();
        }
        source = s.source();
    }
    None
}

/// `memory_high`, `MEMORY_HIGH` and `FOLIOSWAP_MEMORY_HIGH` all name `FOLIOSWAP_MEMORY_HIGH`,
/// as for the C API's `folioswap_set`; `None` for a name that is no engine knob.
fn knob(name: &str) -> Option<String> {
    let upper = name.trim().to_ascii_uppercase();
    let var = if upper.starts_with("FOLIOSWAP_") { upper } else { format!("FOLIOSWAP_{upper}") };
    ENV_VARS.iter().any(|(n, _)| *n == var).then_some(var)
}

/// The engine's knobs as keyword names: `memory_high`, `folio_size`, …
fn knob_names() -> Vec<String> {
    ENV_VARS.iter().map(|(n, _)| n.strip_prefix("FOLIOSWAP_").unwrap_or(n).to_ascii_lowercase()).collect()
}

fn unknown_option(name: &str) -> PyErr {
    let var = format!("FOLIOSWAP_{}", name.trim().to_ascii_uppercase());
    let preload =
        if PRELOAD_VARS.iter().any(|(n, _)| *n == var) { " (it is a setting of the preloaded library, not of the engine)" } else { "" };
    PyTypeError::new_err(format!(
        "Engine() got an unexpected keyword argument '{name}'{preload}; the engine's options are {}",
        knob_names().join(", ")
    ))
}

/// A running engine (`folioswap::Engine`). Its threads stop when this object and every
/// `Mapping` from it are gone.
#[pyclass(module = "folioswap._folioswap", name = "Engine", frozen)]
struct PyEngine {
    /// `Some` until dropped (taken in `Drop`, to stop the engine without the GIL).
    engine: Option<Engine>,
}

impl PyEngine {
    fn engine(&self) -> &Engine {
        self.engine.as_ref().expect("an engine is only taken when it is dropped")
    }
}

#[pymethods]
impl PyEngine {
    /// Start an engine configured as `Config::from_env()` (the `FOLIOSWAP_*` variables),
    /// then `options`, `(name, value)` pairs applied in order with `Config::set`: the same
    /// values, and the same messages, as the environment variables.
    #[new]
    fn new(py: Python<'_>, options: Vec<(String, String)>) -> PyResult<Self> {
        let mut config = Config::from_env().map_err(to_py)?;
        for (name, value) in &options {
            let var = knob(name).ok_or_else(|| unknown_option(name))?;
            config = config.set(&var, value).map_err(to_py)?;
        }
        let engine = py.detach(move || Engine::new(config)).map_err(to_py)?;
        Ok(PyEngine { engine: Some(engine) })
    }

    /// Map `nbytes` of managed, zero-filled memory (rounded up to the folio size), with
    /// the engine's folio size or `folio_size`. `None` for `nbytes == 0` (no region can
    /// be empty), once `folio_size` is checked.
    #[pyo3(signature = (nbytes, folio_size = None))]
    fn map(&self, py: Python<'_>, nbytes: usize, folio_size: Option<&str>) -> PyResult<Option<Mapping>> {
        let mut options = RegionOptions::default();
        if let Some(size) = folio_size {
            options = options.folio_size(size).map_err(to_py)?;
        }
        if nbytes == 0 {
            return Ok(None);
        }
        let engine = self.engine().clone();
        let region = py.detach(move || engine.map(nbytes, options)).map_err(to_py)?;
        Ok(Some(Mapping { region: Some(region), nbytes }))
    }

    /// `Engine::stats()` as JSON, the same document as the CLI's and the C API's.
    fn stats_json(&self, py: Python<'_>) -> PyResult<String> {
        let engine = self.engine().clone();
        py.detach(move || serde_json::to_string(&engine.stats())).map_err(|e| PyValueError::new_err(e.to_string()))
    }

    /// The configuration the engine runs with, as JSON.
    fn config_json(&self) -> PyResult<String> {
        serde_json::to_string(self.engine().config()).map_err(|e| PyValueError::new_err(e.to_string()))
    }
}

impl Drop for PyEngine {
    fn drop(&mut self) {
        // The last handle stops and joins the engine's threads: let other Python threads
        // run meanwhile. Without an interpreter to detach from (at exit), drop in place.
        if let Some(engine) = self.engine.take() {
            if let Err(engine) = detached_drop(engine) {
                drop(engine);
            }
        }
    }
}

/// Drop `value` with the GIL released; `Err(value)` when this thread cannot attach to the
/// interpreter (it is finalizing).
fn detached_drop<T: Send>(value: T) -> Result<(), T> {
    let mut value = Some(value);
    let dropped = Python::try_attach(|py| {
        let v = value.take();
        py.detach(move || drop(v));
    });
    match (dropped, value) {
        (None, Some(v)) => Err(v),
        _ => Ok(()),
    }
}

/// One region of an engine, seen by numpy as a 1-D array of `nbytes` unsigned bytes
/// through `__array_interface__`; `folioswap.Engine.zeros` views it with the dtype and
/// shape asked for. The region (and with it the engine) lives as long as this object,
/// which numpy keeps as the `.base` of every array made from it.
#[pyclass(module = "folioswap._folioswap", frozen)]
struct Mapping {
    /// `Some` until dropped (taken in `Drop`, to unmap without the GIL).
    region: Option<Region>,
    /// What was asked for: the region may be longer (whole folios).
    nbytes: usize,
}

impl Mapping {
    fn region(&self) -> &Region {
        self.region.as_ref().expect("a region is only taken when it is dropped")
    }
}

#[pymethods]
impl Mapping {
    /// numpy's array interface (version 3): `nbytes` writable bytes at the region's start.
    #[getter]
    fn __array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("version", 3)?;
        d.set_item("shape", (self.nbytes,))?;
        d.set_item("typestr", "|u1")?;
        // (address, read-only flag): the region is readable and writable from any thread.
        d.set_item("data", (self.region().as_ptr() as usize, false))?;
        d.set_item("strides", py.None())?;
        Ok(d)
    }

    /// The region's address.
    #[getter]
    fn address(&self) -> usize {
        self.region().as_ptr() as usize
    }

    /// The bytes asked for (the array's `nbytes`).
    #[getter]
    fn nbytes(&self) -> usize {
        self.nbytes
    }

    /// The region's length: `nbytes` rounded up to whole folios.
    #[getter]
    fn region_bytes(&self) -> usize {
        self.region().len()
    }

    /// The region's folio size, as `64K` or `2M`.
    #[getter]
    fn folio_size(&self) -> String {
        self.region().folio_size().to_string()
    }

    fn __len__(&self) -> usize {
        self.nbytes
    }

    fn __repr__(&self) -> String {
        let r = self.region();
        format!("<folioswap Mapping of {} bytes at {:#x}, {} folios>", self.nbytes, r.as_ptr() as usize, r.folio_size())
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // Unmapping releases every folio the engine holds for the region and waits for
        // evictions in flight on it: let other Python threads run meanwhile.
        if let Some(region) = self.region.take() {
            if let Err(region) = detached_drop(region) {
                drop(region);
            }
        }
    }
}

/// The engine's option names, as keyword arguments of `folioswap.Engine`.
#[pyfunction]
fn option_names() -> Vec<String> {
    knob_names()
}

#[pymodule]
fn _folioswap(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyEngine>()?;
    m.add_class::<Mapping>()?;
    m.add_function(wrap_pyfunction!(option_names, m)?)?;
    Ok(())
}
