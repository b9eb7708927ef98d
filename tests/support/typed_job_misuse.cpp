// For tests/install_test.sh: training_job_actor turns a message outside the
// job's protocol into a compile error. Built with -DFOREMAN_MISUSE it must
// not compile; without, it must (so the failure is the message's type).
#include <caf/scoped_actor.hpp>
#include <foreman/actor_api.hpp>

void SendTo(caf::actor_system& system, const foreman::training_job_actor& job) {
  caf::scoped_actor self{system};
#ifdef FOREMAN_MISUSE
  self->send(job, foreman::ProgressStep{});  // a message the job sends, never takes
#else
  self->send(job, foreman::start_atom::value);
#endif
}
