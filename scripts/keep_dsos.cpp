// LD_PRELOAD'ed into the ranks of the sanitizer build's multi-rank tests (scripts/test.sh's
// asan_mpi_tests, through scripts/mpirun.sh's KILN_MPI_PRELOAD): dlclose does nothing, so the
// shared objects a process loaded stay mapped until it exits. Open MPI unloads its plugins
// (mca_*.so) in MPI_Finalize; what their globals held then looks leaked to LeakSanitizer,
// which runs later, and the allocating frames print as "<unknown module>", which no
// suppression can name. Kept loaded, Open MPI reports a handful of leaks, each in a library
// scripts/lsan.supp names. Built by test.sh: c++ -shared -fPIC -o libkeep_dsos.so keep_dsos.cpp
extern "C" int dlclose(void*) { return 0; }
