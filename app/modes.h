#pragma once

// The modes this build runs: the one list, picked by name (no static registrars). A new mode is a
// folder under modes/ and one line in modes.cc.

#include <memory>

#include "daemon/mode.h"
#include "modes/common/common_kinds.h"
#include "proto/kinds.h"

namespace bcd {

// Every mode, in the order `bcd version` lists them.
inline constexpr proto::Mode kModes[] = {proto::Mode::kNode, proto::Mode::kSite,
                                         proto::Mode::kRamdisk};

// The mode `mode`, reading the common kinds from `sources`.
std::unique_ptr<Mode> MakeMode(proto::Mode mode, const CommonSources& sources = {});

}  // namespace bcd
