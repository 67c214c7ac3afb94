#pragma once
// Everything ditops offers: #include <ditops/ditops.hpp>.

#include <ditops/attention.hpp>
#include <ditops/guidance.hpp>
#include <ditops/instance.hpp>
#include <ditops/linear.hpp>
#include <ditops/mla.hpp>
#include <ditops/norm.hpp>
#include <ditops/quant_model.hpp>
#include <ditops/rope.hpp>
#include <ditops/runtime.hpp>
#include <ditops/sparse.hpp>
#include <ditops/tensor.hpp>
