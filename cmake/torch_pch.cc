// The translation unit hyrec_torch_pch compiles: LibTorch's headers, precompiled once for every
// target that includes them (CMakeLists.txt, HYREC_TORCH_PCH).
