# Included before every project() of the vendored whisper.cpp and llama.cpp
# builds (CMAKE_PROJECT_INCLUDE_BEFORE, set by setup.sh and test.sh): leaves
# out what voxline never calls. llama.cpp's common library would otherwise
# compile cpp-httplib (~10,500 lines, ~30 s of one core) to download models
# from a URL; voxline's models come only through `voxline models fetch`.
set(LLAMA_HTTPLIB OFF CACHE BOOL "voxline: no model downloads in llama.cpp" FORCE)
