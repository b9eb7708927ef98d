// TODO(issue 4): stub until written
#pragma once
