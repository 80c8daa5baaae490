// Linked into the test executables of the sanitizer build only (RH_SANITIZE). LibTorch allocates
// at start-up and never frees (its operator registry, thread pools), so LeakSanitizer would fail
// every test at exit: leak detection is off. Every ASan and UBSan error still stops the test.
extern "C" const char* __asan_default_options() { return "detect_leaks=0:abort_on_error=1"; }
extern "C" const char* __ubsan_default_options() { return "print_stacktrace=1:halt_on_error=1"; }
