// A shared library without the entry point: load_backend must refuse it.
extern "C" int kiln_test_not_an_entry() { return 1; }
