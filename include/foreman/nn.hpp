// TODO(issue 5): stub
#pragma once
