//! The counting allocator the memory-bound tests measure with. A global allocator belongs to
//! the test binary, not to a library every test links, so this is a macro the test file calls.

/// Declares, in the calling test file: `ALLOC`, the system allocator counting the bytes live in
/// the process (installed as the global allocator); `live()`, those bytes now; and `SERIAL`, a
/// lock the file's tests take so that none allocates while another measures.
///
/// ```
/// seawall_test_support::counting_allocator!();
///
/// fn main() {
///     let _serial = SERIAL.try_lock().expect("no other test of this file runs");
///     let before = live();
///     let buffer = vec![0u8; 1 << 16];
///     assert!(live() - before >= 1 << 16, "the buffer is counted");
///     drop(buffer);
///     assert!(live() - before < 1 << 16, "and given back");
/// }
/// ```
#[macro_export]
macro_rules! counting_allocator {
    () => {
        /// The system allocator, counting the bytes live in the process. The tests of this
        /// file take [`SERIAL`] so that none allocates while a flood test measures.
        #[global_allocator]
        static ALLOC: $crate::cap::Cap<::std::alloc::System> =
            $crate::cap::Cap::new(::std::alloc::System, usize::MAX);

        /// Serializes the tests of this file.
        static SERIAL: $crate::tokio::sync::Mutex<()> = $crate::tokio::sync::Mutex::const_new(());

        /// The bytes live in the process now.
        fn live() -> isize {
            ALLOC.allocated() as isize
        }
    };
}
