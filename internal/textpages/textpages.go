// Package textpages gives back the pages of the running executable that
// only its start touched.
//
// A Go program's package initialisation runs code and reads tables spread
// over its whole binary, and the kernel maps file pages around each fault
// (fault-around, 64 KiB at a time), so a gateway that has only started has
// most of its binary's code and read-only data mapped: about 13 MiB of the
// sidecar's 15 MiB resident set at rest, against 2 MiB of its own memory.
// Those pages are the node's page cache, shared by every process that runs
// the binary; but every tool that reads a process's memory (ps and top,
// process_resident_memory_bytes, the OOM killer's score) counts them in
// each process's RSS, and the kernel keeps mapped executable pages in
// memory in preference to others. Unmapping the read-only segments once
// the start is over (madvise MADV_DONTNEED; the file does not change, so a
// page used again comes back from the page cache on a minor fault) leaves
// mapped only what the process goes on using.
package textpages
