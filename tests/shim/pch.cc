// The precompiled header's own translation unit (tests/CMakeLists.txt: sp_test_pch).
