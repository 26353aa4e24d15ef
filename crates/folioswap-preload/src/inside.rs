//! Which threads are running the library's own code: their allocations and mappings go
//! straight to libc, never to the engine. A leaf: everything else in the library asks it.

thread_local! {
    /// Set while this thread runs library code that may call an interposed function.
    static INSIDE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether the calling thread is inside the library (its calls go straight to libc).
pub fn inside() -> bool {
    INSIDE.with(|c| c.get())
}

/// Run `f` marked as inside the library.
pub fn within<T>(f: impl FnOnce() -> T) -> T {
    let was = INSIDE.with(|c| c.replace(true));
    let r = f();
    INSIDE.with(|c| c.set(was));
    r
}
