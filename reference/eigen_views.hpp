// reference/eigen_views.hpp — the contract's strided views as row-major Eigen matrices, without a
// copy: the one mapping of reference.cpp, reference_lmhead.cpp and lmhead_check.cpp. Internal to
// the layer.
#pragma once

#include <Eigen/Dense>
#include <cstdint>

#include "burstlab/lmhead.hpp"
#include "burstlab/tensor.hpp"

namespace burstlab::reference::eigen {

template <class T>
using Mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using DynStride = Eigen::Stride<Eigen::Dynamic, Eigen::Dynamic>;
template <class T>
using ConstMap = Eigen::Map<const Mat<T>, 0, DynStride>;

// A 2-D view: rows step stride[0], columns stride[1].
template <class T>
ConstMap<T> map(const View2<const T>& v) {
  return ConstMap<T>(v.data, v.dim[0], v.dim[1], DynStride(v.stride[0], v.stride[1]));
}

// The (N, d) slice of a 4-D view at (b, h): rows step stride[2], columns stride[3].
template <class T>
ConstMap<T> slice(const View4<const T>& v, int64_t b, int64_t h) {
  return ConstMap<T>(v.row(b, h, 0), v.dim[2], v.dim[3], DynStride(v.stride[2], v.stride[3]));
}

}  // namespace burstlab::reference::eigen
