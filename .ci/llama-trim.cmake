# Included before every project() of the vendored whisper.cpp and llama.cpp
# builds (CMAKE_PROJECT_INCLUDE_BEFORE, set by setup.sh and test.sh): leaves
# out what voxline never calls.
#
# llama.cpp's common library (argument parsing, Jinja chat templates, JSON
# schemas to grammars, downloads: an 11.9 MB archive, the slowest part of the
# llama.cpp build on 2 cores): voxline calls only llama.h's API. llama-cpp-sys-2
# still compiles its small wrapper around common, but nothing voxline links
# references it, so without the library nothing is missing at link time (a
# call that needed it would fail to link, not at run time).
set(LLAMA_BUILD_COMMON OFF CACHE BOOL "voxline: llama.cpp's common library is not used" FORCE)
# Its cpp-httplib (~10,500 lines, ~30 s of one core) downloads models from a
# URL; voxline's models come only through `voxline models fetch`.
set(LLAMA_HTTPLIB OFF CACHE BOOL "voxline: no model downloads in llama.cpp" FORCE)
