// tests/support/precompiled.cpp: the translation unit that builds the tests' precompiled
// header (tests/CMakeLists.txt, target tileattn_test_pch); it has nothing of its own.
